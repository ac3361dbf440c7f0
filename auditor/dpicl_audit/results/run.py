"""A run's results (:class:`RunResult`): what ``run --json`` prints, the trial log stores and
``show`` and ``report`` read back; and the exit status they give."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.probes.registry import PROBES
from dpicl_audit.results.record import COUNT, MAPPING, NUMBER, SAME, TEXT, Codec, Record
from dpicl_audit.results.setting import SettingResult
from dpicl_audit.verdicts import Status, Verdict, worst_status

__all__ = ["RunResult", "refused_trials", "results_exit_code", "underpowered"]


@dataclass(frozen=True)
class RunResult(Record):
    """A run's results: what ``run --json`` prints, the trial log stores and ``show`` and
    ``report`` read back. ``verify``: a ``--profile verify`` run's tail-gap companion."""

    run_id: str | None = None
    kind: str | None = None
    status: str | None = None
    mechanism: str | None = None
    confidence: float | None = None
    delta: float | None = None
    settings: tuple[SettingResult, ...] = ()
    ledger: Mapping[str, Any] | None = None
    tail_gap: RunResult | None = None
    queries: int | None = None
    llm_calls: int | None = None
    wall_time_s: float | None = None

    CODECS: ClassVar[dict[str, Codec]] = (
        dict.fromkeys(("run_id", "kind", "status", "mechanism"), TEXT)
        | dict.fromkeys(("confidence", "delta"), NUMBER)
        | {"ledger": MAPPING}
        | dict.fromkeys(("queries", "llm_calls"), COUNT)
        | {"wall_time_s": NUMBER, "settings": SAME, "verify": SAME}
    )

    @classmethod
    def _typed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._typed(data)
        settings = data.get("settings")
        if isinstance(settings, list) and all(isinstance(s, Mapping) for s in settings):
            out["settings"] = tuple(SettingResult.from_json(s) for s in settings)
        else:
            out.pop("settings", None)  # a legacy shape: kept as stored, in extra
        verify = data.get("verify")
        out.pop("verify", None)
        if isinstance(verify, Mapping) and set(verify) == {"tail_gap"}:
            out["verify"] = None  # typed: written back from tail_gap
            out["tail_gap"] = RunResult.from_json(verify["tail_gap"])
        return out

    def _written(self) -> JsonObject:
        out = super()._written()
        listed = self.settings or "settings" in self.keys
        out["settings"] = [s.to_json() for s in self.settings] if listed else None
        out["verify"] = None if self.tail_gap is None else {"tail_gap": self.tail_gap.to_json()}
        return out

    @property
    def threat_models(self) -> list[str]:
        """The threat models the run estimated (empty where the results do not say)."""
        return list(self.extra.get("threat_models") or [])

    @property
    def design(self) -> JsonMapping:
        """The mechanism's summary of the run's design (:meth:`~dpicl_audit.mechanisms.base.
        MechanismAudit.summary`); empty where none was stored."""
        found = self.extra.get("design")
        return found if isinstance(found, Mapping) else {}

    @property
    def server(self) -> JsonMapping:
        """The server's /healthz as the run recorded it (``versions.server``)."""
        versions = self.extra.get("versions")
        found = versions.get("server") if isinstance(versions, Mapping) else None
        return found if isinstance(found, Mapping) else {}

    @property
    def family_size(self) -> int | None:
        """How many figures the run's claims hold for together (:mod:`~dpicl_audit.
        estimators.family`); None for a run estimated before claims were stated per run."""
        family = self.extra.get("family")
        return family.get("size") if isinstance(family, Mapping) else None

    @property
    def probe_wall_time_s(self) -> dict[str, float]:
        """Each audit from outside's wall seconds (empty where the run did not time them)."""
        found = self.extra.get("probe_wall_time_s")
        return {str(k): float(v) for k, v in found.items()} if isinstance(found, Mapping) else {}

    @property
    def probes_left_out(self) -> list[str]:
        """The audits from outside the run's plan left out (``--probes``): the run could not
        have seen what they see."""
        return [str(p) for p in self.extra.get("probes_left_out") or []]

    def verdicts(self) -> list[Verdict]:
        """Every verdict of the run's settings."""
        return [v for s in self.settings for v in s.verdicts()]

    def statuses(self) -> list[Status]:
        """Every status that decides the run's exit code: its verdicts' and its probes'
        (:meth:`probes`)."""
        return [v.status for v in self.verdicts()] + [
            st for _, _, st in self.probes() if st is not None
        ]

    def probes(self) -> list[tuple[str, JsonMapping, Status | None]]:
        """The run's audits from outside, in :data:`~dpicl_audit.probes.registry.PROBES`'
        order: each one's name, its section as stored, and the status it adds to the run's
        (None: it adds none)."""
        out = []
        for name, probe in PROBES.items():
            found = self.get(name)  # the ledger's typed field, the others' extra
            if isinstance(found, Mapping) and found:
                out.append((name, found, probe.deciding.get(str(found.get("status")))))
        return out


def results_exit_code(results: Sequence[RunResult | JsonMapping], *, strict: bool = False) -> int:
    """The exit status for these runs' results (typed, or as stored): :data:`~dpicl_audit.
    verdicts.EXIT_CODES` of the worst of their :meth:`RunResult.statuses`, else 0 (every
    figure consistent, or no verdict at all).

    The gate (docs/auditing.md, "Exit codes"): an INCONCLUSIVE figure is one that could not
    have seen a violation (too few trials for its epsilon), not a finding, so it exits 0
    unless ``strict`` (``--strict``), where it exits 3. A NONCONFORMING, VIOLATION or BUG
    figure exits 4 or 5 either way. A run whose trials the server refused without the
    refusals depending on the world (:func:`refused_trials`) could not ask what it planned:
    it exits 1 (an error) unless a finding exits 4 or 5."""
    runs = [r if isinstance(r, RunResult) else RunResult.from_json(r) for r in results]
    worst = worst_status([st for r in runs for st in r.statuses()])
    code = 0 if worst is Status.INCONCLUSIVE and not strict else worst.exit_code
    if code < 4 and refused_trials(runs):
        return 1
    return code


def refused_trials(results: Sequence[RunResult | JsonMapping]) -> list[str]:
    """One line per setting whose trials the server refused, the refusals not depending on
    the world (a dependent one is a VIOLATION of the setting's figures): run, setting and
    the refusals' message (issue 44; :mod:`dpicl_audit.estimators.channels`)."""
    runs = [r if isinstance(r, RunResult) else RunResult.from_json(r) for r in results]
    out = []
    for run in runs:
        for s in run.settings:
            found = s.extra.get("refusals")
            if isinstance(found, Mapping) and found.get("status") == "refused":
                out.append(f"{run.run_id} {s.setting}: {found.get('message')}")
        for name, section, _ in run.probes():
            if section.get("status") == "refused":
                out.append(f"{run.run_id} {name} probe refused: {section.get('message')}")
    return out


def underpowered(results: Sequence[RunResult | JsonMapping]) -> list[str]:
    """One line per INCONCLUSIVE figure of these runs: run, setting, threat model and the
    verdict's message (which says how many trials would give it power), for the gate's
    report of what passed without power."""
    runs = [r if isinstance(r, RunResult) else RunResult.from_json(r) for r in results]
    out = []
    for run in runs:
        for s in run.settings:
            found = [("black-box", s.black_box), ("white-box", s.white_box)]
            verdicts = [(t, e.verdict) for t, e in found if e is not None]
            verdicts += [("rdp", s.rdp_verdict)]
            for threat, v in verdicts:
                if v is not None and v.status is Status.INCONCLUSIVE:
                    out.append(f"{run.run_id} {s.setting} {threat}: {v.message}")
    return out
