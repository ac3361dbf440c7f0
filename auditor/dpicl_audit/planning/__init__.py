"""What a plan implies before and beside its trials, for the mechanisms and the pipeline alike.

====================  ============================================================
module                what it holds
====================  ============================================================
:mod:`.schedule`      run ids, each trial's world, the random streams of a run
:mod:`.ledger`        the budget a context is created with, and the server's ledger
                      audited from outside (a probe context asked until refused)
:mod:`.budgets`       the plan's budgets: answers per context, contexts per world
:mod:`.ledger_burst`  the ledger under concurrency: N + k requests in flight per route
:mod:`.calibration`   the reported sigma against the claim at the epsilons the plan
                      does not audit (one context each, no answer)
:mod:`.parameters`    the client parameters varied on every route (temperature, top_p)
:mod:`.surface`       every route's whole response (headers, stream chunks, usage) and
                      max_tokens against a generation context's limit
:mod:`.deployment`    a deployed context's own epsilon, delta and partitions in the plan
:mod:`.sections`      the shapes of the probes' results sections
====================  ============================================================

Below :mod:`dpicl_audit.mechanisms` (a context body carries its budget, a bootstrap draws
from the run's streams) and :mod:`dpicl_audit.pipeline`.
"""
