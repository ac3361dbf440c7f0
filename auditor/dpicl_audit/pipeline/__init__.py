"""The run pipeline: an audit plan in, a trial log and its results out.

Modules in the order a run uses them (each imports only those above it, and the packages
below this one: the plan's schedule and budgets, the mechanisms, the probes' registry):

===================  ==============================================================
module               what it holds
===================  ==============================================================
:mod:`.progress`     progress bars on a terminal, a plain line every few seconds
:mod:`.profiles`     ``run --profile``: the tail-gap companion run of ``verify``
:mod:`.session`      what a run opens: trial log, client, ``/healthz``, versions
:mod:`.estimation`   a run's results from its log, generic over the mechanism (a log
                     of an older audit upgraded by its mechanism)
:mod:`.results`      ``results.json`` and the run's table
:mod:`.run_context`  the run's one state (store, target, run id, plan, mechanism,
                     design) that the contexts, the trials and the runner act on
:mod:`.contexts`     the run's server contexts: create, adopt (fingerprint), replace
:mod:`.trials`       missing trials run concurrently, logged in idempotent batches
:mod:`.runner`       a run's execution: trials or clean rows, estimates, the probes
                     from outside (:mod:`dpicl_audit.probes`), results
:mod:`.run`          one life for ``run``, ``bootstrap`` and ``resume``: opened,
                     begun, executed, results written
===================  ==============================================================
"""
