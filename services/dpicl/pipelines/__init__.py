"""The kit every mechanism's pipeline uses (each pipeline lives in its mechanism's folder);
it sits below the mechanisms and knows none of them.

* :mod:`~dpicl.pipelines.partitioning`: exemplars -> T disjoint partitions (pure).
* :mod:`~dpicl.pipelines.partitions`: partition and zero-shot prompts, query checks.
* :mod:`~dpicl.pipelines.engine_calls`: pay first, refund on failure.
* :mod:`~dpicl.pipelines.votes`: a partition's vote from its label scores (voting's step,
  and the zero-shot baseline's).

Creating a context, which calibrates it by its mechanism, sits above the mechanisms:
:mod:`dpicl.serving.contexts`.
"""
