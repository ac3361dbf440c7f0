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

:mod:`.common` holds the app and shared options, :mod:`.stopping` a command's run to its
end or its Ctrl-C or SIGTERM (the exit status, the resume line), :mod:`.flags` the
``run``/``bootstrap`` flags (an option and the plan path it sets), help texts and parsers,
:mod:`.audit_options` those commands' options in the panels ``--help`` shows, :mod:`.audit`
those commands, :mod:`.log` the commands over the trial log, :mod:`.rdp` ``divergence``,
:mod:`.lazy` the command list (each command's module is imported only when it runs).
"""

from __future__ import annotations

# The commands' modules (:mod:`.audit`, :mod:`.log`, :mod:`.rdp`, :mod:`.utility`) register
# their commands on the app when a command is resolved (:mod:`.lazy`), not here: importing
# the plan and the estimators took about 2 s before `dpicl-audit --help` printed a line.
from dpicl_audit.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
