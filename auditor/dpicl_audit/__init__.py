"""dpicl-audit: black-box and white-box privacy auditing of DP-ICL endpoints over HTTP.

An independent implementation: it never imports the server package ``dpicl`` and talks to a
server only through HTTP API v1 (docs/architecture.md). "Paper 000", "paper 003" and "paper
004" in the docstrings are the three papers the project implements (Xia, Liu, Xiong 2025;
Chadha et al., ICML 2024; Flemings et al. 2025): docs/references.md gives their full
citations and every other work cited. The folder tree is the architecture;
modules are listed in the order data flows through an audit::

    plan.py            the audit plan model, validated once
    plan_sources.py    where plans come from: TOML file, CLI flags, the stored JSON
    attacks.py         which attack applies to which mechanism and threat model
    datasets.py        bundled corpora, bbc-news (docs/data.md), JSONL/CSV/Hugging Face
    prompts.py         the audit prompts of paper 000 (Appendix B) and DPS-MOZO's
    mechanisms/        one module per audited mechanism, one protocol (base.py):
      base.py            neighbours, query, observation -> decision/score, exact epsilon,
                         bootstrap; helpers shared by the Gaussian mechanisms
      neighbours.py      replace-one helpers (canary texts, exemplars, slot)
      voting.py          private voting (+ voting_bootstrap.py)
      esa.py             embedding space aggregation (+ esa_signals.py, esa_estimates.py)
      mozo.py            DPS-MOZO
      conformance_checks.py  each mechanism's conformance tests of one setting
    client.py          the async HTTP client (retries, timeouts, concurrency)
    schedule.py        run ids, each trial's world, the random streams
    contexts.py        the run's server contexts: create, adopt (fingerprint-checked), replace
    trials.py          missing trials run concurrently, logged in idempotent batches
    progress.py        progress bars on a terminal, a line every few seconds elsewhere
    store.py           the SQL trial log (SQLite or PostgreSQL)
    session.py         what a run opens: trial log, client, /healthz, versions
    runner.py          run, bootstrap and resume: the steps above in order
    estimation.py      a run's results from its log, generic over the mechanism
    estimators/        the statistics (Clopper-Pearson, GDP, classical, RDP, thresholds,
                       conformance of the releases to the design's prediction, ROC)
    ledger.py          budgeted audit contexts, and the server's ledger audited from outside
    profiles.py        ``run --profile``: the tail-gap companion run of ``verify``
    bootstrap.py       Algorithm 1 of paper 000, vectorised; noise_check.py its guard
    verdicts.py        what a bound says about the claims (violation, bug, nonconforming,
                       inconclusive, ok) and the CLI's exit code by the worst of them
    results.py         results.json and the run's table
    report/            the report: data, words, table, curves, plots, html, writer
    legacy.py          logs written before the pipeline held every mechanism
    cli/               ``dpicl-audit``: common, audit (run/bootstrap), log (resume, list, ...)
    demo.py            ``make demo``

A new mechanism is one module in ``mechanisms/`` registered in
:data:`dpicl_audit.mechanisms.MECHANISMS`; a new attack is an entry in
:data:`dpicl_audit.attacks.ATTACKS` handled by the mechanisms it applies to; a new verdict
is a branch in :mod:`dpicl_audit.verdicts`.

Every error the auditor raises on purpose belongs to one tree (:mod:`dpicl_audit.errors`)::

    Exception
    └── AuditError                      anything the auditor raises on purpose
        ├── InvalidAuditInput           a bad input value (also a ValueError)
        │   ├── InvalidPlan             an audit plan that fails validation
        │   └── DatasetError            a dataset that cannot be found, read or used
        ├── TargetError                 the server under audit could not be used
        │   ├── TargetRejected          the server answered 4xx (status, code, message, param)
        │   │   ├── TargetUnauthorized  401: a missing or wrong token
        │   │   ├── TargetNotFound      404: an unknown context, or /v1/debug/* switched off
        │   │   └── TargetBudgetExhausted  403 (OpenAI surface: 429): the budget is spent
        │   ├── TargetUnavailable       no answer after every retry (connection, timeout, 5xx)
        │   └── TargetProtocolError     an answer that does not follow HTTP API v1, or a
        │                               context that does not match the audit's settings
        └── RunNotFound                 no run with that id in the trial log
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("dpicl-audit")
except metadata.PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.1.0"

__all__ = ["__version__"]
