"""epsilon_emp on growing numbers of trials, for the report's third plot."""

from __future__ import annotations

import numpy as np

from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.pipeline.estimation import estimate_setting
from dpicl_audit.planning.schedule import CLEAN_SETTING
from dpicl_audit.report.data import THREATS, RunData, num

__all__ = ["trials_curve"]


def _prefix_sizes(total: int, smallest: int, points: int = 8) -> list[int]:
    if total <= smallest:
        return [total]
    grid = np.unique(np.round(np.geomspace(smallest, total, points)).astype(int))
    return [int(v) for v in grid]


def trials_curve(rd: RunData) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """epsilon_emp on growing numbers of trials: {setting: {threat: [(trials, eps), ...]}}.

    Real-query runs: the runner's estimator on the first n logged trials (trial-index order).
    Bootstrap runs: the runner's bootstrap estimator with n simulated trials per world from
    the same clean votes (the last point is the run's own result).
    """
    plan, design = rd.plan, rd.design
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for k, s in enumerate(rd.results.get("settings", [])):
        # The setting's facts (ESA: its signal geometry too) without its estimates.
        meta = {key: v for key, v in s.items() if key not in _ESTIMATES}
        meta["sigma"] = num(s.get("sigma"))
        meta["epsilon_exact"] = num(s.get("epsilon_exact"))
        curves: dict[str, list[tuple[int, float]]] = {"black-box": [], "white-box": []}
        if rd.kind == "bootstrap":
            clean = rd.trials.get(CLEAN_SETTING, [])
            total = plan.bootstrap.n_sample
            for n in _prefix_sizes(total, min(1000, total), 6):
                if n == total:
                    res = s
                else:
                    p = plan.model_copy(
                        update={"bootstrap": plan.bootstrap.model_copy(update={"n_sample": n})}
                    )
                    res = estimate_setting(SettingRows(p, design, k, clean, dict(meta), True))
                for threat, key in THREATS:
                    est = res.get(key) or {}
                    v = num(est.get("epsilon_emp", est.get("epsilon_lower")))
                    if v is not None and "error" not in est:
                        curves[threat].append((2 * n, v))
        else:
            rows = sorted(rd.trials.get(str(s["setting"]), []), key=lambda r: r.trial_index)
            for n in _prefix_sizes(len(rows), min(40, len(rows)), 8):
                res = estimate_setting(SettingRows(plan, design, k, rows[:n], dict(meta), False))
                for threat, key in THREATS:
                    est = res.get(key) or {}
                    v = num(est.get("epsilon_emp", est.get("epsilon_lower")))
                    if v is not None and "error" not in est:
                        curves[threat].append((n, v))
        out[str(s["setting"])] = curves
    return out


_ESTIMATES = ("black_box", "white_box", "noise_check", "sigma_simulated")
