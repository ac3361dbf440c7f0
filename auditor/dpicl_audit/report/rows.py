"""The report's table rows: one per (run, epsilon, threat model) the run estimated, and one
per paper-003 RDP audit (:mod:`.rdp`)."""

from __future__ import annotations

from collections.abc import Sequence

from dpicl_audit.report.data import THREATS, ReportRow, RunData, num
from dpicl_audit.report.rdp import rdp_row
from dpicl_audit.store import TrialRecord

__all__ = ["report_rows"]


def _setting_wall_time(rows: Sequence[TrialRecord]) -> float | None:
    """Wall time of one setting's real trials: first completion to last, plus one latency."""
    if not rows:
        return None
    times = [r.created_at for r in rows]
    span = (max(times) - min(times)).total_seconds()
    first = min(rows, key=lambda r: r.created_at)
    return float(span + first.latency_s)


def _whole(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def report_rows(runs: Sequence[RunData]) -> list[ReportRow]:
    """The table: one row per (run, epsilon, threat model) the run estimated."""
    rows: list[ReportRow] = []
    for rd in runs:
        run = rd.results
        conf = float(rd.plan.confidence if run.confidence is None else run.confidence)
        method = "bootstrap" if rd.kind == "bootstrap" else "real trials"
        models = run.threat_models or ["black-box"]
        layout = run.design.get("design")
        design = f"{rd.plan.canary} canary, {rd.plan.setting}"
        if layout:
            design = f"{layout} design, {design}"
        design = rd.plan.mechanism.design_text(rd.plan) or design
        for s in run.settings:
            for threat, key in THREATS:
                est = s.estimate(key)
                if threat not in models or est is None or not est.keys:
                    continue
                if rd.kind == "bootstrap":
                    wall, shared = num(run.wall_time_s), True
                else:
                    wall, shared = _setting_wall_time(rd.trials.get(str(s.setting), [])), False
                rows.append(
                    ReportRow(
                        run_id=rd.run_id,
                        engine=rd.engine,
                        method=method,
                        setting=str(s.setting),
                        threat=threat,
                        epsilon_theory=num(s.epsilon_theory),
                        epsilon_exact=num(s.epsilon_exact),
                        epsilon_emp=num(est.epsilon_shown),
                        mu_lower=num(est.mu_lower),
                        confidence=conf,
                        trials=s.trials,
                        n_llm=_whole(s.extra.get("n_llm")),
                        llm_calls=s.llm_calls,
                        wall_time_s=wall,
                        wall_time_shared=shared,
                        status=est.status,
                        message=est.error or ("" if est.verdict is None else est.verdict.message),
                        noise_check=s.noise_check,
                        error=est.error,
                        epsilon_exact_shift=num(s.extra.get("epsilon_exact_signal")),
                        mechanism=rd.mechanism,
                        attack=rd.plan.attack,
                        design=design,
                        epsilon_classic=num(est.epsilon_lower_classic),
                        family_size=run.family_size,
                    )
                )
            if s.rdp is not None:  # paper 003's RDP audit of the setting: its own row
                wall = _setting_wall_time(rd.trials.get(str(s.setting), []))
                rows.append(rdp_row(rd, s, conf=conf, method=method, wall_time_s=wall))
    return rows
