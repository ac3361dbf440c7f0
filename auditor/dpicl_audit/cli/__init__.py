"""``dpicl-audit``: the auditor's command line.

::

    dpicl-audit run        audit with real queries (flags, or --plan plan.toml plus flags);
                           --mechanism voting | esa | dps-mozo
    dpicl-audit bootstrap  audit with Algorithm 1 (clean rows + simulated noise)
    dpicl-audit resume RUN continue a run that stopped (killed, failed, interrupted)
    dpicl-audit list       the runs in the trial log (mechanism, kind, status, progress)
    dpicl-audit show RUN   a run's results table (from the log)
    dpicl-audit report RUN [RUN ...]  one report (table, JSON, HTML with plots) of the runs
    dpicl-audit estimate   bounds from attack counts obtained elsewhere (JSON)
    dpicl-audit divergence exact Renyi divergence of noisy argmax between two histograms
    dpicl-audit utility    accuracy per epsilon and T beside the baselines (docs/utility.md)

Every command takes ``--db`` (a SQLAlchemy URL or a SQLite file path; default
``sqlite:///runs/audit.db``, or ``DPICL_AUDIT_DB``). Tokens come from flags or the
environment (``DPICL_AUDIT_ADMIN_TOKEN``, ``DPICL_AUDIT_API_KEY``) and are never stored.
Exit status: 0 on success, 1 when the audit fails (the message says why), 2 on bad usage.

:mod:`.common` holds the app and shared options, :mod:`.flags` the ``run``/``bootstrap``
flags (an option and the plan path it sets), help texts and parsers, :mod:`.audit_options`
those commands' options in the panels ``--help`` shows, :mod:`.audit` those commands,
:mod:`.log` the commands over the trial log, :mod:`.rdp` ``divergence``.
"""

from __future__ import annotations

from dpicl_audit.cli import audit as _audit  # noqa: F401  (registers run, bootstrap)
from dpicl_audit.cli import log as _log  # noqa: F401  (registers resume, list, show, ...)
from dpicl_audit.cli import rdp as _rdp  # noqa: F401  (registers divergence)
from dpicl_audit.cli import utility as _utility  # noqa: F401  (registers utility)
from dpicl_audit.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
