"""The run pipeline: an audit plan in, a trial log and its results out.

Modules in the order a run uses them (each imports only those above it, and the packages
below this one: :mod:`dpicl_audit.planning` holds the schedule and the budgets the mechanisms
use too):

===================  ==============================================================
module               what it holds
===================  ==============================================================
:mod:`.progress`     progress bars on a terminal, a plain line every few seconds
:mod:`.profiles`     ``run --profile``: the tail-gap companion run of ``verify``
:mod:`.session`      what a run opens: trial log, client, ``/healthz``, versions
:mod:`.legacy`       trial logs written before the pipeline held every mechanism
:mod:`.estimation`   a run's results from its log, generic over the mechanism
:mod:`.results`      ``results.json`` and the run's table
:mod:`.run_context`  the run's one state (store, target, run id, plan, mechanism,
                     design) that the contexts, the trials and the runner act on
:mod:`.contexts`     the run's server contexts: create, adopt (fingerprint), replace
:mod:`.trials`       missing trials run concurrently, logged in idempotent batches
:mod:`.runner`       a run's execution: trials or clean rows, estimates, results
:mod:`.run`          one life for ``run``, ``bootstrap`` and ``resume``: opened,
                     begun, executed, results written
===================  ==============================================================
"""
