"""dpicl-audit: black-box and white-box privacy auditing of DP-ICL endpoints over HTTP.

An independent implementation: it never imports the server package ``dpicl`` and talks to a
server only through HTTP API v1 (docs/architecture.md). "Paper 000", "paper 003" and "paper
004" in the docstrings are the three papers the project implements (Xia, Liu, Xiong 2025;
Chadha et al., ICML 2024; Flemings et al. 2025): docs/references.md gives their full
citations and every other work cited. The folder tree is the architecture. Packages and
modules are listed from the bottom up: each imports only those above it (its own package
aside; ``tests/auditor/test_structure.py`` checks these layers and that no import, even one
inside a function, closes a cycle)::

    errors.py          the exception tree (below)
    jsontypes.py       JsonObject: what the auditor writes as JSON, its values checked
    context_info.py    ContextInfo, MechanismInfo: the record a server keeps of a context
                       (its answer to POST/GET /v1/contexts), typed, checked where it enters
    claims.py          SettingClaims: what a setting claims (epsilon, sigma, exact
                       epsilons, the run's Family) and its mechanism's own facts, typed
    prompts.py         the audit prompts of paper 000 (Appendix B) and DPS-MOZO's
    datasets.py        bundled corpora, bbc-news (docs/data.md), JSONL/CSV/Hugging Face
    client/            the server under audit over HTTP: http (retries, timeouts,
                       concurrency), openai (an OpenAI-compatible surface), context_hook
    store/             the SQL trial log (SQLite or PostgreSQL): db, log
    estimators/        the statistics: counts, Clopper-Pearson, GDP, classical, exact,
                       RDP, thresholds, white-box figures, power, conformance, family-wise
                       claims; bootstrap.py (Algorithm 1 of paper 000, vectorised) and
                       noise_check.py its guard; figure_power.py, trial_budget.py,
                       composition.py (the budget that holds q answers of a claim)
    catalog/           what the plan names: settings (what every mechanism's audit
                       settings share), mechanisms (the one list of them, each loaded by
                       name), attacks (each one's threat models and source)
    verdicts/          what a bound says about the claims (violation, bug, nonconforming,
                       inconclusive, ok): model (the one Verdict type, its Status and the
                       CLI's exit code by the worst of them), claims (the rules applied)
    probes/            the audits from outside, on fresh contexts of their own: registry
                       (PROBES, the one list), ingredients (what a mechanism supplies them),
                       ledger, ledger_burst, calibration, parameters, surface, positions,
                       tails, answers, sections
    results/           a run's results typed, from the estimators to the report (RunResult,
                       SettingResult, Estimate) and their one edge to JSON: record,
                       estimate, setting, run
    plan/              the audit plan, validated once: sources (TOML file, CLI flags, the
                       stored JSON), specs (its sections), model (AuditPlan); what it
                       implies: schedule (worlds, streams), budgets, deployment
    mechanisms/        one package per audited mechanism, one protocol:
      base.py            the protocol, and helpers every audit may use
      gaussian.py        what the Gaussian mechanisms' audits share (voting, ESA)
      neighbours.py      replace-one helpers (canary texts, exemplars, slot, design)
      trial_estimates.py the trials' figures, verdicts and conformance every audit reads
      voting/            private voting: settings, design, build, rdp, conformance,
                         bootstrap, rdp_estimates, estimates, audit
      esa/               embedding space aggregation: settings, design, build, signals,
                         estimates, bootstrap, audit
      dps_mozo/          DPS-MOZO: settings, design, check, claim, findings, legacy, audit
      registry.py        MECHANISMS: the built-in audits and those of entry points
    pipeline/          a run: progress, profiles, session, estimation, results,
                       run_context (the run's one state), contexts, trials, runner (the
                       steps in order), run (one life for run, bootstrap and resume)
    utility/           ``dpicl-audit utility``, the privacy-utility audit: plan (cells,
                       draws), estimators (accuracy intervals, ROUGE-L, bootstrap), report
                       (results from the log), contexts, runner
    report/            the report: data, rows, rdp, words, table, figure, curves, plots,
                       cards, ledger_section, probes, utility_card, html, writer
    cli/               ``dpicl-audit``: common, flags, audit (run/bootstrap), log (resume,
                       list, ...), rdp (divergence), utility
    demo/              ``make demo``: servers, audits, main

A new mechanism is one package in ``mechanisms/`` (its settings named in
:data:`dpicl_audit.catalog.mechanisms.BUILTIN`), or one outside this package registered
through the ``dpicl_audit.mechanisms`` entry point group (``examples/laplace_voting``); a
new attack is an entry in :data:`dpicl_audit.catalog.attacks.ATTACKS` named in the
``attacks`` of the mechanisms that handle it; a new verdict is a branch in
:mod:`dpicl_audit.verdicts`.

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
        │   │   └── TargetBudgetExhausted  402 (older servers: 403, 429): the budget is spent
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
