"""epsilon_emp on growing numbers of trials, for the report's third plot."""

from __future__ import annotations

import numpy as np

from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.registry import get_mechanism
from dpicl_audit.pipeline.estimation import estimate_setting
from dpicl_audit.plan.schedule import CLEAN_SETTING
from dpicl_audit.report.data import THREATS, RunData, num
from dpicl_audit.results import SettingResult

__all__ = ["trials_curve"]


def _prefix_sizes(total: int, smallest: int, points: int = 8) -> list[int]:
    if total <= smallest:
        return [total]
    grid = np.unique(np.round(np.geomspace(smallest, total, points)).astype(int))
    return [int(v) for v in grid]


def _estimate(rows: SettingRows) -> SettingResult:
    """The setting's estimates from these rows, typed as the run's results are."""
    return estimate_setting(rows).stored()


def _shown(s: SettingResult) -> list[tuple[str, float]]:
    """(threat model, the epsilon the table shows) of each estimate that has one."""
    out = []
    for threat, key in THREATS:
        est = s.estimate(key)
        v = None if est is None or est.error is not None else num(est.epsilon_shown)
        if v is not None:
            out.append((threat, v))
    return out


def trials_curve(rd: RunData) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """epsilon_emp on growing numbers of trials: {setting: {threat: [(trials, eps), ...]}}.

    Real-query runs: the runner's estimator on the first n logged trials (trial-index order).
    Bootstrap runs: the runner's bootstrap estimator with n simulated trials per world from
    the same clean votes (the last point is the run's own result).
    """
    plan, design = rd.plan, rd.design
    mech = get_mechanism(plan.mechanism.name)
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for k, setting in enumerate(rd.results.settings):
        # The setting's claims (ESA: its signal geometry too), as its estimate reads them.
        claims = mech.claims_from_json(setting.to_json())
        curves: dict[str, list[tuple[int, float]]] = {"black-box": [], "white-box": []}
        if rd.kind == "bootstrap":
            clean = rd.trials.get(CLEAN_SETTING, [])
            total = plan.bootstrap.n_sample
            for n in _prefix_sizes(total, min(1000, total), 6):
                if n == total:
                    res = setting
                else:
                    p = plan.model_copy(
                        update={"bootstrap": plan.bootstrap.model_copy(update={"n_sample": n})}
                    )
                    res = _estimate(SettingRows(p, design, k, clean, claims, True))
                for threat, v in _shown(res):
                    curves[threat].append((2 * n, v))
        else:
            rows = sorted(rd.trials.get(str(setting.setting), []), key=lambda r: r.trial_index)
            for n in _prefix_sizes(len(rows), min(40, len(rows)), 8):
                res = _estimate(SettingRows(plan, design, k, rows[:n], claims, False))
                for threat, v in _shown(res):
                    curves[threat].append((n, v))
        out[str(setting.setting)] = curves
    return out
