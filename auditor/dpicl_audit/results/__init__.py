"""A run's results, typed, from the estimators that make them to the report that reads them
(issue 28, item 2): :class:`RunResult` (the run), :class:`SettingResult` (one epsilon),
:class:`Estimate` (one threat model's figures and verdict, or its error), :class:`RdpAudit`
(paper 003's RDP audit of a setting); the verdict is the
one :class:`~dpicl_audit.verdicts.Verdict` type.

The mechanisms build them (:meth:`~.record.Record.of`, :meth:`~.record.Record.updated`);
their JSON is written only at the edges, where a run's results are stored or printed.
:meth:`RunResult.from_json` reads any stored shape (today's, and those the legacy upgrade
gives, :func:`dpicl_audit.mechanisms.registry.upgraded_run`) and :meth:`RunResult.to_json`
writes it back exactly, keys in their stored order: a key these classes do not type (a
mechanism's own facts and figures, a newer auditor's) is kept in ``extra``, and a typed key
that was absent stays absent. Non-finite floats, stored as ``"inf"``/``"nan"`` strings
(:func:`jsonable`), read as floats and write back as those strings.

Modules::

    record.py    the typed JSON object (Record: codecs, extra, key order), jsonable
    estimate.py  Estimate: one threat model's counts, bounds and verdict, or its error
    rdp.py       RdpAudit: paper 003's RDP audit of one setting, its curves and verdict
    setting.py   SettingResult: one epsilon's claims, trials, estimates and checks
    run.py       RunResult: the run; results_exit_code, the exit status of runs' results
    overall.py   the overall verdict of runs in one line, with the exit status it gives
"""

from __future__ import annotations

from dpicl_audit.results.estimate import Estimate
from dpicl_audit.results.rdp import RdpAudit
from dpicl_audit.results.record import Record, jsonable
from dpicl_audit.results.run import RunResult, refused_trials, results_exit_code, underpowered
from dpicl_audit.results.setting import SettingResult

__all__ = [
    "Estimate",
    "RdpAudit",
    "Record",
    "RunResult",
    "SettingResult",
    "jsonable",
    "refused_trials",
    "results_exit_code",
    "underpowered",
]
