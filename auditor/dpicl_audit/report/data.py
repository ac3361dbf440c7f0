"""The report's data: each run's results and trials, and the table's rows.

Everything comes from the trial log: a run's stored results when it completed, else a fresh
:func:`~dpicl_audit.pipeline.estimation.estimate_run`. Every row names the run's mechanism, attack,
design (canary kind and setting), method (real trials or bootstrap) and threat model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from dpicl_audit.catalog.mechanisms import default_mechanism_name
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.mechanisms.base import Design
from dpicl_audit.pipeline.estimation import estimate_run, load_run, run_design, run_plan
from dpicl_audit.plan import AuditPlan
from dpicl_audit.probes.sections import LedgerSection
from dpicl_audit.results import RunResult
from dpicl_audit.store import TrialRecord, TrialStore

__all__ = ["THREATS", "ReportRow", "RunData", "load_run_results", "load_runs", "num"]

THREATS = (("black-box", "black_box"), ("white-box", "white_box"))


def num(value: Any) -> float | None:
    """A float from a results value (``"inf"``/``"nan"`` strings included), None if absent."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class RunData:
    run_id: str
    kind: str
    results: RunResult
    plan: AuditPlan
    design: Design
    engine: str
    label: str
    trials: dict[str, list[TrialRecord]]

    @property
    def mechanism(self) -> str:
        return self.plan.mechanism.name

    @property
    def ledger(self) -> LedgerSection | None:
        """The ledger's audit from outside (:mod:`dpicl_audit.probes.ledger`), where the run
        had one: stored from a :class:`~dpicl_audit.probes.sections.LedgerSection`, read as
        it was written."""
        led = self.results.ledger
        return cast(LedgerSection, led) if isinstance(led, Mapping) else None

    @property
    def probe_statuses(self) -> list[str]:
        """The statuses the run's audits from outside add to its verdicts' (the ledger, the
        calibration scan, the parameters, the surface, the tails: RunResult.probes)."""
        return [st.value for _, _, st in self.results.probes() if st is not None]

    @property
    def simulated(self) -> bool:
        """Whether the estimates come from simulated trials (bootstrap)."""
        return self.kind == "bootstrap"


@dataclass(frozen=True)
class ReportRow:
    """One line of the report's table."""

    run_id: str
    engine: str
    method: str  # "real trials" | "bootstrap"
    setting: str
    threat: str
    epsilon_theory: float | None
    epsilon_exact: float | None
    epsilon_emp: float | None
    mu_lower: float | None
    confidence: float
    trials: int | None
    n_llm: int | None
    llm_calls: int | None
    wall_time_s: float | None
    wall_time_shared: bool
    status: str
    message: str
    noise_check: JsonMapping | None
    error: str | None = None
    # ESA: the exact epsilon for the canary's actual embedding shift ||e(y1)-e(y0)||/T
    # instead of the worst case 2/T (looseness of the analysis vs weakness of the attack).
    epsilon_exact_shift: float | None = None
    # A row of a run whose plan named no mechanism: the plan's default, then as now.
    mechanism: str = field(default_factory=default_mechanism_name)
    attack: str = "inquery"
    design: str = ""  # design, canary kind and setting, e.g. "pivotal, natural canary, ..."
    # The assumption-free classical (epsilon, delta) bound from the same trials (its own
    # threshold); epsilon_emp/mu_lower are the GDP figure (assumes a Gaussian trade-off).
    epsilon_classic: float | None = None
    # How many figures the run's claims hold for together (estimators.family); None for a
    # run estimated before claims were stated for the run (each figure then stands alone).
    family_size: int | None = None

    def to_dict(self) -> JsonObject:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _engine_of(results: RunResult) -> str:
    server = results.server
    engine = str(server.get("engine") or "unknown engine")
    if server.get("simulator"):
        return f"{engine} (simulator)"
    model = server.get("model")
    if model:
        short = str(model).rstrip("/").split("/")[-1].split()[0]
        return f"{engine}: {short}"
    return engine


def load_run_results(store: TrialStore, run_id: str) -> RunResult:
    """The run's stored results if it completed, else recomputed from its trial log."""
    run = load_run(store, run_id)
    if run.status == "completed" and run.results is not None:
        results = dict(run.results)
    else:
        results = estimate_run(store, run_id).to_json()
        results |= {
            "queries": run.queries,
            "llm_calls": run.llm_calls,
            "wall_time_s": run.wall_time_s,
        }
    results.setdefault("versions", dict(run.versions))
    results["status"] = run.status
    return RunResult.from_json(results)


def load_runs(store: TrialStore, run_ids: Sequence[str]) -> list[RunData]:
    """Every run's results, plan, design and trials; labels unique across the runs."""
    out: list[RunData] = []
    labels: dict[str, int] = {}
    for rid in run_ids:
        run = load_run(store, rid)
        if run.design is None:
            raise InvalidAuditInput(f"run {rid} has no design recorded; nothing to report")
        results = load_run_results(store, rid)
        engine = _engine_of(results)
        method = "bootstrap" if run.kind == "bootstrap" else "real trials"
        plan = run_plan(run)
        # A run is shown by its name (--name, the demo's names); an unnamed one by what it is.
        label = (run.name or plan.name or "").strip()
        if not label:
            label = f"{engine} · {plan.mechanism.name} {plan.attack} {method}"
            if run.kind != "bootstrap":
                label += f" ({plan.threat_model} run)"
        labels[label] = labels.get(label, 0) + 1
        trials: dict[str, list[TrialRecord]] = {}
        for rec in store.trials(rid):
            trials.setdefault(rec.setting, []).append(rec)
        out.append(
            RunData(rid, run.kind, results, plan, run_design(run, plan), engine, label, trials)
        )
    seen: dict[str, int] = {}
    for rd in out:  # identical labels: numbered in order (#1, #2), not by a hash of the id
        if labels[rd.label] > 1:
            seen[rd.label] = seen.get(rd.label, 0) + 1
            rd.label = f"{rd.label} #{seen[rd.label]}"
    return out
