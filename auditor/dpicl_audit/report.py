"""Audit reports: a results table (terminal + JSON) and a self-contained HTML file with plots.

:func:`write_report` reports on one run (``dpicl-audit report RUN``) or, given several run
ids, on all of them side by side (:func:`write_combined_report`; the demo puts the real
model's runs beside the oracle simulator's). Everything comes from the trial log: a run's
stored results when it completed, else a fresh :func:`~dpicl_audit.runner.estimate_run`.

The table has one row per (run, epsilon, threat model): epsilon_theory (as configured),
epsilon_exact (the true curve of the Gaussian mechanism at the sigma the server reports, via
dp-accounting), epsilon_emp (the audit's lower bound) with its confidence, the trials, the LLM
calls and the wall time. The verdicts are the runner's (``verdict`` of every estimate), put in
plain words here: a bound above epsilon_theory means the privacy claim is VIOLATED; a bound
above epsilon_exact but not above the claim means the server or the auditor has a bug.

The HTML embeds its plots as base64 PNGs (matplotlib, Agg backend) and loads nothing else:

1. epsilon_emp against epsilon_theory and epsilon_exact, per epsilon audited;
2. the empirical trade-off points (the Clopper-Pearson upper bounds on FPR and FNR the bound
   is computed from) against the Gaussian curve ``f(x) = Phi(Phi^-1(1 - x) - mu)`` of the
   mechanism's exact ``mu = sensitivity / sigma``, and the (epsilon_theory, delta) claim;
3. epsilon_emp against the number of trials: the estimator recomputed on prefixes of the
   logged trials (real-query runs) or on smaller simulated samples (bootstrap runs, same
   clean votes).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text
from scipy import stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import (
    VOTING_SENSITIVITY,
    clopper_pearson_upper,
    per_interval_confidence,
)
from dpicl_audit.generation import GenerationDesign
from dpicl_audit.plan import AuditPlan
from dpicl_audit.runner import (
    CLEAN_SETTING,
    Design,
    _jsonable,
    estimate_run,
    estimate_setting,
    load_design,
    write_results,
)
from dpicl_audit.store import TrialRecord, TrialStore

__all__ = ["ReportRow", "load_run_results", "report_rows", "write_combined_report", "write_report"]

THREATS = (("black-box", "black_box"), ("white-box", "white_box"))
_STATUS_ORDER = {"violation": 3, "bug": 2, "ok": 1, "error": 0, "": 0}


# ====================================================================== data


def _num(value: Any) -> float | None:
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
    results: dict[str, Any]
    plan: AuditPlan
    design: Design
    engine: str
    label: str
    trials: dict[str, list[TrialRecord]]


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
    noise_check: dict[str, Any] | None
    error: str | None = None
    # ESA: the exact epsilon for the canary's actual embedding shift ||e(y1)-e(y0)||/T
    # instead of the worst case 2/T (looseness of the analysis vs weakness of the attack).
    epsilon_exact_shift: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _engine_of(results: Mapping[str, Any]) -> str:
    server = (results.get("versions") or {}).get("server") or {}
    engine = str(server.get("engine") or "unknown engine")
    if server.get("simulator"):
        return f"{engine} (simulator)"
    model = server.get("model")
    if model:
        short = str(model).rstrip("/").split("/")[-1].split()[0]
        return f"{engine}: {short}"
    return engine


def load_run_results(store: TrialStore, run_id: str) -> dict[str, Any]:
    """The run's stored results if it completed, else recomputed from its trial log."""
    run = store.get_run(run_id)
    if run.status == "completed" and run.results is not None:
        results = dict(run.results)
    else:
        results = estimate_run(store, run_id)
        results |= {
            "queries": run.queries,
            "llm_calls": run.llm_calls,
            "wall_time_s": run.wall_time_s,
        }
    results.setdefault("versions", run.versions)
    results["status"] = run.status
    return results


def _load(store: TrialStore, run_ids: Sequence[str]) -> list[RunData]:
    out: list[RunData] = []
    labels: dict[str, int] = {}
    for rid in run_ids:
        run = store.get_run(rid)
        if run.design is None:
            raise InvalidAuditInput(f"run {rid} has no design recorded; nothing to report")
        results = load_run_results(store, rid)
        engine = _engine_of(results)
        method = "bootstrap" if run.kind == "bootstrap" else "real trials"
        plan = AuditPlan.from_public(run.plan)
        label = f"{engine} · {plan.mechanism.name} {method}"
        if run.kind != "bootstrap":
            label += f" ({plan.threat_model} run)"
        labels[label] = labels.get(label, 0) + 1
        trials: dict[str, list[TrialRecord]] = {}
        for rec in store.trials(rid):
            trials.setdefault(rec.setting, []).append(rec)
        out.append(
            RunData(
                rid,
                run.kind,
                results,
                plan,
                load_design(run.design),
                engine,
                label,
                trials,
            )
        )
    for rd in out:  # disambiguate identical labels by run id
        if labels[rd.label] > 1:
            rd.label = f"{rd.label} ({rd.run_id[-6:]})"
    return out


def _setting_wall_time(rows: Sequence[TrialRecord]) -> float | None:
    """Wall time of one setting's real trials: first completion to last, plus one latency."""
    if not rows:
        return None
    times = [r.created_at for r in rows]
    span = (max(times) - min(times)).total_seconds()
    first = min(rows, key=lambda r: r.created_at)
    return float(span + first.latency_s)


def report_rows(runs: Sequence[RunData]) -> list[ReportRow]:
    """The table: one row per (run, epsilon, threat model) the run estimated."""
    rows: list[ReportRow] = []
    for rd in runs:
        res = rd.results
        conf = float(res.get("confidence", rd.plan.confidence))
        method = "bootstrap" if rd.kind == "bootstrap" else "real trials"
        models = res.get("threat_models") or ["black-box"]
        for s in res.get("settings", []):
            for threat, key in THREATS:
                if threat not in models:
                    continue
                est = s.get(key)
                if not est:
                    continue
                if rd.kind == "bootstrap":
                    wall, shared = _num(res.get("wall_time_s")), True
                else:
                    wall, shared = _setting_wall_time(rd.trials.get(s["setting"], [])), False
                verdict = est.get("verdict") or {}
                status = "error" if "error" in est else str(verdict.get("status", ""))
                rows.append(
                    ReportRow(
                        run_id=rd.run_id,
                        engine=rd.engine,
                        method=method,
                        setting=str(s["setting"]),
                        threat=threat,
                        epsilon_theory=_num(s.get("epsilon_theory")),
                        epsilon_exact=_num(s.get("epsilon_exact")),
                        epsilon_emp=_num(est.get("epsilon_lower")),
                        mu_lower=_num(est.get("mu_lower")),
                        confidence=conf,
                        trials=int(s["trials"]) if s.get("trials") is not None else None,
                        n_llm=int(s["n_llm"]) if s.get("n_llm") is not None else None,
                        llm_calls=int(s["llm_calls"]) if s.get("llm_calls") is not None else None,
                        wall_time_s=wall,
                        wall_time_shared=shared,
                        status=status,
                        message=str(est.get("error") or verdict.get("message", "")),
                        noise_check=s.get("noise_check"),
                        error=est.get("error"),
                        epsilon_exact_shift=_num(s.get("epsilon_exact_signal")),
                    )
                )
    return rows


# ====================================================================== words


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def _eps_label(setting: str) -> str:
    return setting.replace("eps=", "ε=")


def verdict_sentence(row: ReportRow) -> str:
    """The plain-words verdict of one row."""
    where = f"{row.engine}, {row.method}, {row.threat}, at epsilon {_fmt(row.epsilon_theory, 3)}"
    conf = f"{row.confidence:.0%}"
    if row.status == "violation":
        text = (
            f"PRIVACY CLAIM VIOLATED ({where}): the audit proves epsilon >= "
            f"{_fmt(row.epsilon_emp)} with {conf} confidence, above the claimed "
            f"{_fmt(row.epsilon_theory, 3)}."
        )
        exact = row.epsilon_exact
        if exact is not None and row.epsilon_emp is not None and row.epsilon_emp > exact:
            text += (
                f" It is also above the exact epsilon {_fmt(exact)} of the mechanism the "
                "server reports, so the server does not run the mechanism it claims."
            )
        return text
    if row.status == "bug":
        return (
            f"BUG ({where}): epsilon_emp {_fmt(row.epsilon_emp)} ({conf} confidence) exceeds "
            f"the mechanism's exact epsilon {_fmt(row.epsilon_exact)}, though not the claimed "
            f"{_fmt(row.epsilon_theory, 3)}: the server or the auditor has a bug."
        )
    if row.status == "error":
        return f"no estimate ({where}): {row.message}"
    return (
        f"consistent ({where}): epsilon_emp {_fmt(row.epsilon_emp)} <= epsilon_exact "
        f"{_fmt(row.epsilon_exact)} <= epsilon_theory {_fmt(row.epsilon_theory, 3)}."
    )


def run_verdict(rows: Sequence[ReportRow]) -> str:
    """The worst status of a run's rows: violation > bug > ok."""
    worst = max((r.status for r in rows), key=lambda s: _STATUS_ORDER.get(s, 0), default="")
    return worst or "error"


def _noise_findings(rows: Sequence[ReportRow]) -> list[str]:
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows:
        nc = r.noise_check
        if not nc or (r.run_id, r.setting) in seen:
            continue
        seen.add((r.run_id, r.setting))
        if nc.get("status") in ("smaller", "larger"):
            out.append(f"{r.engine}, {r.method}, {_eps_label(r.setting)}: {nc.get('message')}")
    return out


# ====================================================================== terminal table


def rich_table(rows: Sequence[ReportRow], title: str) -> Table:
    table = Table(
        title=title,
        caption=(
            "ε emp: Gaussian-DP lower bound at the stated confidence (white-box thresholds "
            "chosen on a held-out split). Bootstrap: trials are simulated from n_llm clean "
            "vote vectors per world; its LLM calls and wall time (*) are the whole run's, "
            "shared by every ε."
        ),
    )
    for col in (
        "engine",
        "method",
        "ε",
        "threat",
        "ε theory",
        "ε exact",
        "ε exact (shift)",
        "ε emp (conf)",
        "trials",
        "LLM calls",
        "wall s",
        "verdict",
    ):
        right = col not in ("engine", "method", "ε", "threat", "verdict")
        table.add_column(col, justify="right" if right else "left")
    for r in rows:
        style = {"violation": "bold red", "bug": "bold yellow", "ok": "green"}.get(r.status, "")
        verdict = {"violation": "VIOLATED", "bug": "BUG", "ok": "ok"}.get(r.status, r.status)
        if r.noise_check and r.noise_check.get("status") == "smaller":
            verdict += " · noise<claim"
        trials = "-" if r.trials is None else f"{r.trials:,}"
        if r.method == "bootstrap" and r.n_llm is not None:
            trials += f" sim (n_llm={r.n_llm})"
        wall = _fmt(r.wall_time_s, 1) + ("*" if r.wall_time_shared else "")
        table.add_row(
            r.engine,
            r.method,
            _eps_label(r.setting),
            r.threat,
            _fmt(r.epsilon_theory, 2),
            _fmt(r.epsilon_exact),
            _fmt(r.epsilon_exact_shift),
            f"{_fmt(r.epsilon_emp)} ({r.confidence:.0%})",
            trials,
            "-" if r.llm_calls is None else f"{r.llm_calls:,}",
            wall,
            Text(verdict, style=style),
        )
    return table


# ====================================================================== plots


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
_MARKERS = {"black-box": "o", "white-box": "s"}


def _series_style(runs: Sequence[RunData]) -> dict[str, str]:
    return {rd.run_id: _COLORS[i % len(_COLORS)] for i, rd in enumerate(runs)}


def _finite(v: float | None, cap: float) -> float | None:
    if v is None or math.isnan(v):
        return None
    return min(v, cap)


def plot_epsilons(runs: Sequence[RunData], rows: Sequence[ReportRow]) -> str:
    """epsilon_emp against epsilon_theory and epsilon_exact, per epsilon audited."""
    plt = _pyplot()
    colors = _series_style(runs)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    theory = sorted({r.epsilon_theory for r in rows if r.epsilon_theory is not None})
    if not theory:
        ax.text(0.5, 0.5, "no estimates", ha="center")
        return _png(fig)
    top = max(theory) * 1.25
    ax.plot([0, top], [0, top], "k--", lw=1, label="ε theory (claimed)")
    exact_curves: set[tuple[tuple[float, float], ...]] = set()
    for rd in runs:
        pts = tuple(
            sorted(
                {
                    (r.epsilon_theory, r.epsilon_exact)
                    for r in rows
                    if r.run_id == rd.run_id
                    and r.epsilon_theory is not None
                    and r.epsilon_exact is not None
                }
            )
        )
        if pts and pts not in exact_curves:
            exact_curves.add(pts)
            xs, ys = zip(*pts, strict=True)
            ax.plot(
                xs,
                ys,
                "-",
                color="0.35",
                lw=2,
                alpha=0.6,
                label="ε exact (the reported mechanism)" if len(exact_curves) == 1 else None,
            )
    cap = top * 2
    for rd in runs:
        for threat, _key in THREATS:
            sel = [
                r
                for r in rows
                if r.run_id == rd.run_id and r.threat == threat and r.epsilon_theory is not None
            ]
            pts2 = [
                (r.epsilon_theory, _finite(r.epsilon_emp, cap))
                for r in sel
                if _finite(r.epsilon_emp, cap) is not None
            ]
            if not pts2:
                continue
            pts2.sort()
            xs2 = [float(p[0]) for p in pts2 if p[0] is not None]
            ys2 = [float(p[1]) for p in pts2 if p[1] is not None]
            ax.plot(
                xs2,
                ys2,
                marker=_MARKERS[threat],
                ls="-" if threat == "white-box" else ":",
                color=colors[rd.run_id],
                label=f"ε emp: {rd.label}, {threat}",
            )
    ymax = max(
        [top]
        + [
            float(r.epsilon_emp)
            for r in rows
            if r.epsilon_emp is not None and math.isfinite(r.epsilon_emp)
        ]
    )
    ax.set_xlim(0, top)
    ax.set_ylim(0, min(ymax * 1.08, cap))
    ax.set_xticks(theory)
    ax.set_xlabel("ε theory (configured)")
    ax.set_ylabel("ε")
    ax.set_title("Empirical ε (lower bounds) vs the claimed and the exact ε")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    return _png(fig)


def _rate_bounds(est: Mapping[str, Any]) -> tuple[float, float, float, float] | None:
    """(FPR_upper, FNR_upper, FPR, FNR) of one estimate, at its per-interval confidence."""
    try:
        fp, fn = int(est["fp"]), int(est["fn"])
        n_neg, n_pos = int(est["n_neg"]), int(est["n_pos"])
        conf = float(est["confidence"])
        split = str(est.get("split", "bonferroni"))
    except (KeyError, TypeError, ValueError):
        return None
    if n_neg <= 0 or n_pos <= 0:
        return None
    c_each = per_interval_confidence(conf, 2, split)  # type: ignore[arg-type]
    return (
        float(clopper_pearson_upper(fp, n_neg, c_each)),
        float(clopper_pearson_upper(fn, n_pos, c_each)),
        fp / n_neg,
        fn / n_pos,
    )


def _claim_curve(x: np.ndarray[Any, Any], eps: float, delta: float) -> np.ndarray[Any, Any]:
    """The (epsilon, delta)-DP trade-off bound: max(0, 1-d-e^eps x, e^-eps (1-d-x))."""
    out: np.ndarray[Any, Any] = np.maximum.reduce(
        [np.zeros_like(x), 1 - delta - math.exp(eps) * x, math.exp(-eps) * (1 - delta - x)]
    )
    return out


def plot_tradeoff(runs: Sequence[RunData]) -> str:
    """Per epsilon: (FPR_upper, FNR_upper) points against the exact Gaussian mu curve."""
    plt = _pyplot()
    colors = _series_style(runs)
    eps_all = sorted(
        {float(s["epsilon_theory"]) for rd in runs for s in rd.results.get("settings", [])}
    )
    if not eps_all:
        fig, ax = plt.subplots()
        ax.text(0.5, 0.5, "no estimates", ha="center")
        return _png(fig)
    n = len(eps_all)
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 5.2 * nrows), squeeze=False)
    x = np.linspace(0.0, 1.0, 801)
    for idx, eps in enumerate(eps_all):
        ax = axes[idx // ncols][idx % ncols]
        drawn_mu: set[float] = set()
        delta = None
        for rd in runs:
            for s in rd.results.get("settings", []):
                if float(s["epsilon_theory"]) != eps:
                    continue
                delta = float(s.get("delta", rd.plan.mechanism.delta))
                sigma = _num(s.get("sigma"))
                sens = _num(s.get("sensitivity")) or VOTING_SENSITIVITY
                if sigma and sigma > 0:
                    mu = round(sens / sigma, 6)
                    if mu not in drawn_mu:
                        drawn_mu.add(mu)
                        f = stats.norm.cdf(stats.norm.ppf(1 - x) - mu)
                        ax.plot(x, f, color="0.3", lw=2, label=f"exact Gaussian curve, μ={mu:.3g}")
                for threat, key in THREATS:
                    est = s.get(key)
                    if not est or "error" in est:
                        continue
                    b = _rate_bounds(est)
                    if b is None:
                        continue
                    c = colors[rd.run_id]
                    ax.plot(
                        b[0],
                        b[1],
                        marker=_MARKERS[threat],
                        ms=8,
                        color=c,
                        ls="none",
                        label=f"{rd.label}, {threat} (upper bounds)",
                    )
                    ax.plot(
                        b[2], b[3], marker=_MARKERS[threat], ms=5, mfc="none", color=c, ls="none"
                    )
        if delta is not None:
            ax.plot(
                x,
                _claim_curve(x, eps, delta),
                "k--",
                lw=1,
                label=f"({eps:g}, {delta:g})-DP claim: points below it violate it",
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("FPR")
        ax.set_ylabel("FNR")
        ax.set_title(f"ε theory = {eps:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper right")
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.92, hspace=0.3, wspace=0.2)
    fig.suptitle(
        "Trade-off: filled = Clopper-Pearson upper bounds used by the estimate, hollow = "
        "point estimates",
        fontsize=9,
    )
    return _png(fig)


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
        meta = {key: s.get(key) for key in _META_KEYS}
        if isinstance(design, GenerationDesign):
            # ESA settings carry their signal geometry too (shift, exact for the shift).
            meta = {key: v for key, v in s.items() if key not in ("black_box", "white_box")}
        meta["sigma"] = _num(s.get("sigma"))
        meta["epsilon_exact"] = _num(s.get("epsilon_exact"))
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
                    res = estimate_setting(p, design, k, clean, dict(meta), bootstrap=True)
                for threat, key in THREATS:
                    est = res.get(key) or {}
                    v = _num(est.get("epsilon_lower"))
                    if v is not None and "error" not in est:
                        curves[threat].append((2 * n, v))
        else:
            rows = sorted(rd.trials.get(str(s["setting"]), []), key=lambda r: r.trial_index)
            for n in _prefix_sizes(len(rows), min(40, len(rows)), 8):
                res = estimate_setting(plan, design, k, rows[:n], dict(meta), bootstrap=False)
                for threat, key in THREATS:
                    est = res.get(key) or {}
                    v = _num(est.get("epsilon_lower"))
                    if v is not None and "error" not in est:
                        curves[threat].append((n, v))
        out[str(s["setting"])] = curves
    return out


_META_KEYS = (
    "setting",
    "epsilon_theory",
    "delta",
    "partitions",
    "calibration",
    "context_ids",
    "sigma",
    "sensitivity",
    "epsilon_exact",
    "epsilon_exact_server",
)


def plot_trials(runs: Sequence[RunData], curves: Mapping[str, Any]) -> str:
    """Per epsilon: epsilon_emp against the number of trials, with theory and exact lines."""
    plt = _pyplot()
    colors = _series_style(runs)
    eps_map: dict[float, str] = {}
    for rd in runs:
        for s in rd.results.get("settings", []):
            eps_map[float(s["epsilon_theory"])] = str(s["setting"])
    eps_all = sorted(eps_map)
    if not eps_all:
        fig, ax = plt.subplots()
        ax.text(0.5, 0.5, "no estimates", ha="center")
        return _png(fig)
    n = len(eps_all)
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.4 * nrows), squeeze=False)
    for idx, eps in enumerate(eps_all):
        ax = axes[idx // ncols][idx % ncols]
        exacts: set[float] = set()
        ymax = eps * 1.2
        for rd in runs:
            for s in rd.results.get("settings", []):
                if float(s["epsilon_theory"]) != eps:
                    continue
                ex = _num(s.get("epsilon_exact"))
                if ex is not None:
                    exacts.add(round(ex, 6))
                per = curves.get(rd.run_id, {}).get(str(s["setting"]), {})
                for threat, _key in THREATS:
                    pts = per.get(threat) or []
                    pts = [(t, v) for t, v in pts if math.isfinite(v)]
                    if not pts:
                        continue
                    ts, vs = zip(*pts, strict=True)
                    ymax = max(ymax, max(vs) * 1.08)
                    ax.plot(
                        ts,
                        vs,
                        marker=_MARKERS[threat],
                        ms=4,
                        ls="-" if threat == "white-box" else ":",
                        color=colors[rd.run_id],
                        label=f"{rd.label}, {threat}",
                    )
        ax.axhline(eps, color="k", ls="--", lw=1, label="ε theory")
        for i, ex in enumerate(sorted(exacts)):
            ax.axhline(ex, color="0.35", lw=2, alpha=0.6, label="ε exact" if i == 0 else None)
        ax.set_xscale("log")
        ax.set_ylim(0, ymax)
        ax.set_xlabel("trials (bootstrap: simulated, both worlds)")
        ax.set_ylabel("ε emp (lower bound)")
        ax.set_title(f"ε theory = {eps:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="lower right")
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.95, hspace=0.35, wspace=0.2)
    return _png(fig)


# ====================================================================== HTML

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1180px;
color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.86em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
.violation{background:#fde0e0;color:#900;font-weight:bold}
.bug{background:#fff3cd;color:#7a5b00;font-weight:bold}
.ok{color:#17652a}.error{color:#777}
.finding{padding:.45em .8em;margin:.3em 0;border-left:5px solid #999;background:#fafafa}
.finding.violation{border-color:#c00}.finding.bug{border-color:#d9a400}.finding.ok{border-color:#2a8a3e}
img{max-width:100%;border:1px solid #eee}code{background:#f4f4f4;padding:0 .25em}
.small{font-size:.85em;color:#555}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _html_table(rows: Sequence[ReportRow]) -> str:
    head = (
        "<tr><th class=l>engine</th><th class=l>method</th><th class=l>ε</th>"
        "<th class=l>threat</th><th>ε theory</th><th>ε exact</th>"
        "<th title='ESA: exact ε for the canary&#39;s actual embedding shift'>ε exact (shift)</th>"
        "<th>ε emp</th>"
        "<th>confidence</th><th>μ lower</th><th>trials</th><th>LLM calls</th><th>wall s</th>"
        "<th class=l>verdict</th></tr>"
    )
    body = []
    for r in rows:
        verdict = {"violation": "VIOLATED", "bug": "BUG", "ok": "ok"}.get(r.status, r.status)
        if r.noise_check and r.noise_check.get("status") == "smaller":
            verdict += " · noise smaller than claimed"
        trials = "-" if r.trials is None else f"{r.trials:,}"
        if r.method == "bootstrap" and r.n_llm is not None:
            trials += f" simulated<br><span class=small>n_llm={r.n_llm} per world</span>"
        body.append(
            f"<tr><td class=l>{_e(r.engine)}</td><td class=l>{_e(r.method)}</td>"
            f"<td class=l>{_e(_eps_label(r.setting))}</td><td class=l>{_e(r.threat)}</td>"
            f"<td>{_fmt(r.epsilon_theory, 2)}</td><td>{_fmt(r.epsilon_exact)}</td>"
            f"<td>{_fmt(r.epsilon_exact_shift)}</td>"
            f"<td><b>{_fmt(r.epsilon_emp)}</b></td><td>{r.confidence:.0%}</td>"
            f"<td>{_fmt(r.mu_lower)}</td><td>{trials}</td>"
            f"<td>{'-' if r.llm_calls is None else f'{r.llm_calls:,}'}</td>"
            f"<td>{_fmt(r.wall_time_s, 1)}{'*' if r.wall_time_shared else ''}</td>"
            f"<td class='l {_e(r.status)}'>{_e(verdict)}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def _run_details(rd: RunData, rows: Sequence[ReportRow]) -> str:
    p, d, res = rd.plan, rd.design, rd.results
    m = p.mechanism
    server = (res.get("versions") or {}).get("server") or {}
    items = [
        ("run", rd.run_id),
        ("status", res.get("status")),
        ("server", json.dumps(server, sort_keys=True)),
        (
            "method",
            "bootstrap (paper 000, Algorithm 1)" if rd.kind == "bootstrap" else "real queries",
        ),
        ("threat models", ", ".join(res.get("threat_models") or [])),
        ("dataset", p.dataset),
        ("canary", f"{d.canary_kind}: {d.canary.input!r} ({d.canary.output})"),
        ("attack", f"{d.attack}; present = {d.positive!r}, absent = {d.negative!r}"),
        ("neighbours", f"replace-one at position {d.position}, partition_seed {d.partition_seed}"),
        (
            "mechanism",
            f"{m.name}, T={m.partitions}, {m.shots} shots/partition, temperature {m.temperature}, "
            f"delta={m.delta:g}, calibration {m.calibration}"
            + (f", T_cand={m.candidates}, max_tokens={m.max_tokens}" if m.name == "esa" else ""),
        ),
        ("confidence", f"{p.confidence:.0%}"),
    ]
    if rd.kind == "bootstrap":
        items.append(
            (
                "bootstrap",
                f"n_llm={p.bootstrap.n_llm} clean vote vectors per world, "
                f"n_sample={p.bootstrap.n_sample:,} simulated trials per world",
            )
        )
    else:
        items.append(("trials", f"{p.trials} per epsilon, concurrency {p.concurrency}"))
    items += [
        ("queries / LLM calls", f"{res.get('queries')} / {res.get('llm_calls')}"),
        ("wall time", f"{_fmt(_num(res.get('wall_time_s')), 1)} s"),
        ("verdict", run_verdict(rows).upper()),
    ]
    li = "".join(f"<tr><td class=l>{_e(k)}</td><td class=l>{_e(v)}</td></tr>" for k, v in items)
    return f"<h3>{_e(rd.label)}</h3><table>{li}</table>"


def _html(
    title: str,
    runs: Sequence[RunData],
    rows: Sequence[ReportRow],
    images: Sequence[tuple[str, str, str]],
    notes: Sequence[str],
) -> str:
    findings = []
    for r in rows:
        if r.status in ("violation", "bug"):
            findings.append(f"<div class='finding {r.status}'>{_e(verdict_sentence(r))}</div>")
    for text in _noise_findings(rows):
        findings.append(f"<div class='finding violation'>{_e(text)}</div>")
    summary = []
    for rd in runs:
        rr = [r for r in rows if r.run_id == rd.run_id]
        status = run_verdict(rr)
        words = {
            "violation": "the privacy claim is VIOLATED",
            "bug": "the server or the auditor has a BUG (epsilon_emp above epsilon_exact)",
            "ok": "consistent with the claimed privacy at every epsilon audited",
        }.get(status, "no estimate")
        summary.append(f"<div class='finding {status}'><b>{_e(rd.label)}</b>: {_e(words)}.</div>")
    if not findings:
        findings.append(
            "<div class='finding ok'>No audit found more leakage than claimed: every "
            "epsilon_emp is at most epsilon_exact, which is at most epsilon_theory.</div>"
        )
    figs = "".join(
        f"<h2>{_e(h)}</h2><p class=small>{_e(cap)}</p>"
        f"<img alt='{_e(h)}' src='data:image/png;base64,{b64}'>"
        for h, cap, b64 in images
    )
    note_html = "".join(f"<li>{_e(n)}</li>" for n in notes)
    details = "".join(_run_details(rd, [r for r in rows if r.run_id == rd.run_id]) for rd in runs)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{_e(title)}</h1>
<p class=small>Generated {now} by dpicl-audit from the trial log. ε emp is a lower bound on the
server's real ε that holds with the stated confidence; ε exact is the true ε of the Gaussian
voting mechanism at the σ the server reports; ε theory is the ε the context was configured with.
A white-box ε emp may approach ε exact; it can exceed ε exact only through a bug, and ε theory
only through a privacy violation.</p>
<h2>Verdicts</h2>{"".join(summary)}
<h2>Findings</h2>{"".join(findings)}
<h2>Results</h2>{_html_table(rows)}
<p class=small>* bootstrap: one collection of clean votes serves every ε; the wall time and LLM
calls shown are the whole run's. Real trials: the wall time of that ε's trials.</p>
{f"<h2>Notes</h2><ul>{note_html}</ul>" if notes else ""}
{figs}
<h2>Runs</h2>{details}
</body></html>
"""


# ====================================================================== entry points


def _results_payload(
    title: str, runs: Sequence[RunData], rows: Sequence[ReportRow], notes: Sequence[str]
) -> dict[str, Any]:
    return {
        "title": title,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "notes": list(notes),
        "verdicts": {
            rd.run_id: run_verdict([r for r in rows if r.run_id == rd.run_id]) for rd in runs
        },
        "rows": [r.to_dict() for r in rows],
        "runs": {rd.run_id: rd.results for rd in runs},
    }


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_combined_report(
    run_ids: Sequence[str],
    db_url: str | None,
    out_dir: str | Path,
    *,
    name: str | None = None,
    title: str | None = None,
    notes: Sequence[str] = (),
    console: Console | None = None,
) -> Path:
    """One report over several runs, side by side; returns the HTML file's path.

    Writes ``<out_dir>/<name>/report.html`` and ``report.json`` (the table rows, every run's
    results and the verdicts; also as ``results.json`` for a combined report, while a single
    run's ``results.json`` keeps the runner's format) and prints the table. ``name``
    defaults to the run id for one run and ``report-<first run id>`` for several.
    """
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        raise InvalidAuditInput("a report needs at least one run id")
    store = TrialStore(db_url)
    try:
        runs = _load(store, ids)
    finally:
        store.dispose()
    rows = report_rows(runs)
    title = title or (
        f"dpicl audit report: {ids[0]}" if len(ids) == 1 else f"dpicl audit report: {len(ids)} runs"
    )
    console = console or Console(width=max(Console().width, 160))
    console.print(rich_table(rows, title))
    for r in rows:
        if r.status in ("violation", "bug"):
            console.print(f"[bold red]{verdict_sentence(r)}[/bold red]")
    for text in _noise_findings(rows):
        console.print(f"[bold red]{text}[/bold red]")

    curves = {rd.run_id: trials_curve(rd) for rd in runs}
    conf = runs[0].plan.confidence
    images = [
        (
            "ε emp against ε theory and ε exact",
            f"Markers: the audit's lower bounds at {conf:.0%} confidence (circles black-box, "
            "squares white-box). Dashed: the claimed ε; grey: the exact ε of the mechanism "
            "the server reports.",
            plot_epsilons(runs, rows),
        ),
        (
            "Empirical trade-off points against the Gaussian μ curve",
            "Each point is (FPR upper bound, FNR upper bound) of an attack; the grey curve is "
            "f(x) = Φ(Φ⁻¹(1−x) − μ) for the mechanism's exact μ = Δ/σ. A sound server keeps "
            "every filled point above the grey curve (up to confidence); a point below the "
            "dashed line proves the (ε, δ) claim false.",
            plot_tradeoff(runs),
        ),
        (
            "ε emp against the number of trials",
            "The estimator recomputed on the first n logged trials (real queries) or on n "
            "simulated trials from the same clean votes (bootstrap).",
            plot_trials(runs, curves),
        ),
    ]
    dir_name = name or (ids[0] if len(ids) == 1 else f"report-{ids[0]}")
    out = Path(out_dir) / dir_name
    out.mkdir(parents=True, exist_ok=True)
    payload = _results_payload(title, runs, rows, notes)
    payload["trials_curves"] = curves
    text = json.dumps(_jsonable(payload), indent=2) + "\n"
    _write_text(out / "report.json", text)
    if len(runs) == 1 and dir_name == runs[0].run_id:
        write_results(runs[0].results, out_dir)  # the runner's results.json, refreshed
    else:
        _write_text(out / "results.json", text)
    path = out / "report.html"
    _write_text(path, _html(title, runs, rows, images, notes))
    return path


def write_report(
    run_id: str | Sequence[str],
    db_url: str | None,
    out_dir: str | Path,
    *,
    name: str | None = None,
    title: str | None = None,
    notes: Sequence[str] = (),
    console: Console | None = None,
) -> Path:
    """The report of one run (``dpicl-audit report RUN``) or of several side by side.

    Returns ``<out_dir>/<run_id>/report.html``; ``results.json`` lies beside it.
    """
    ids = [run_id] if isinstance(run_id, str) else list(run_id)
    return write_combined_report(
        ids, db_url, out_dir, name=name, title=title, notes=notes, console=console
    )
