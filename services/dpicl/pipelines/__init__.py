"""What every mechanism's pipeline shares (each pipeline lives in its mechanism's folder).

* :mod:`~dpicl.pipelines.contexts`: creating a context (checks, calibration by its
  mechanism, budget) and the cost event of a stored context.
* :mod:`~dpicl.pipelines.partitions`: partition and zero-shot prompts, query checks.
* :mod:`~dpicl.pipelines.engine_calls`: pay first, refund on failure.
"""
