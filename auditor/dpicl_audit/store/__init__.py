"""The SQL trial log: where a run's plan, contexts, trials and results are kept.

=================  ================================================================
module             what it holds
=================  ================================================================
:mod:`.db`         where the log lives (``--db``: a SQLAlchemy URL) and its engine
:mod:`.tables`     the tables: runs, the contexts they created, trials
:mod:`.log`        the records, and :class:`~.log.TrialStore` over the tables
=================  ================================================================

Logs of older versions are upgraded by the mechanism whose older audit wrote them
(:func:`dpicl_audit.mechanisms.registry.upgraded_run`; it needs a mechanism's design). The
records and the store are re-exported here (``from dpicl_audit.store import TrialStore``); the
modules of this package import each other directly.
"""

from __future__ import annotations

from dpicl_audit.store import log
from dpicl_audit.store.log import *  # noqa: F403

__all__ = log.__all__
