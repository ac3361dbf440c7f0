"""The report's plots (matplotlib, Agg), each returned as a base64 PNG.

1. epsilon_emp against epsilon_theory and epsilon_exact, per epsilon audited;
2. the empirical trade-off points (the Clopper-Pearson upper bounds on FPR and FNR the bound
   is computed from) against the Gaussian curve ``f(x) = Phi(Phi^-1(1 - x) - mu)`` of the
   mechanism's exact ``mu = sensitivity / sigma``, and the (epsilon_theory, delta) claim;
3. epsilon_emp against the number of trials, real trials and simulated (bootstrap) trials
   in separate figures (:mod:`.curves` computes the points).

Legends sit below the plot area, never over the data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from dpicl_audit.estimators.exact import VOTING_SENSITIVITY
from dpicl_audit.estimators.stats import clopper_pearson_upper, per_interval_confidence
from dpicl_audit.report.data import THREATS, ReportRow, RunData, num
from dpicl_audit.report.figure import png, pyplot
from dpicl_audit.results import Estimate

__all__ = ["plot_epsilons", "plot_tradeoff", "plot_trials", "run_colors"]


#: The runs' colours. No red, orange or yellow: the report keeps those for what is wrong (a
#: violation, a bug), and a run drawn in red read as a violation on a card that says ok.
_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#005f73", "#393b79", "#7f7f7f", "#637939"]
_MARKERS = {"black-box": "o", "white-box": "s"}


def run_colors(runs: Sequence[RunData]) -> dict[str, str]:
    """One colour per run, fixed over the whole report (cards, tables and every figure):
    computed once from the report's full list of runs, never from a figure's subset."""
    return {rd.run_id: _COLORS[i % len(_COLORS)] for i, rd in enumerate(runs)}


def _series_style(
    runs: Sequence[RunData], colors: Mapping[str, str] | None = None
) -> dict[str, str]:
    return dict(colors) if colors is not None else run_colors(runs)


# The reference lines are drawn above the data series (zorder), in styles no series uses:
# theory dashed black, exact a thick dark-grey dash-dot line. A series lying on a reference
# line no longer hides it.
_THEORY = {"color": "k", "ls": "--", "lw": 1.4, "zorder": 6}
_EXACT = {"color": "0.2", "ls": "-.", "lw": 2.2, "alpha": 0.9, "zorder": 5}


def _short(v: float) -> str:
    """A tick's count in two significant figures (6,628 is 6.6k, 21,972 is 22k): a tick
    reads as a size, not as a figure to copy (issue 45: ticks read 6.628k)."""
    if v >= 1e6:
        return f"{float(f'{v / 1e6:.2g}'):g}M"
    if v >= 1e3:
        return f"{float(f'{v / 1e3:.2g}'):g}k"
    return f"{v:g}"


def _log_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Readable log-axis ticks: at most six, at trial counts the curves were drawn at
    (spread evenly on the log scale), written 500, 2k, 40k; no minor labels. A log locator
    alone gives no label at all when the counts lie within one decade, and crowded minor
    labels when they do not."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    vals = sorted({float(x) for x in xs if x > 0})
    if not vals:
        return
    if len(vals) > 6:
        logs = np.log10(vals)
        targets = np.linspace(logs[0], logs[-1], 6)
        vals = sorted({vals[int(np.argmin(np.abs(logs - t)))] for t in targets})
    ax.xaxis.set_major_locator(FixedLocator(vals))
    ax.set_xticklabels([_short(v) for v in vals])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def legend_outside(fig: Any, axes: Sequence[Any]) -> None:
    """One legend for the whole figure, below the plot area (never over the data)."""
    seen: dict[str, object] = {}  # label -> its first artist handle
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label and not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=1 if len(seen) > 6 else 2,
            fontsize=8,
            frameon=False,
        )


def _no_estimates(plt: Any) -> str:
    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "no estimates", ha="center")
    return png(fig)


def _panels(plt: Any, n: int, height: float) -> tuple[Any, list[Any], list[Any]]:
    """A figure of ``n`` panels, two a row, each 6.2 wide and ``height`` tall: the figure, the
    ``n`` panels in order, and every axes (a spare one turned off)."""
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, height * nrows), squeeze=False)
    every = [a for row in axes for a in row]
    for ax in every[n:]:
        ax.axis("off")
    return fig, every[:n], every


def _finite(v: float | None, cap: float) -> float | None:
    if v is None or math.isnan(v):
        return None
    return min(v, cap)


def plot_epsilons(
    runs: Sequence[RunData],
    rows: Sequence[ReportRow],
    colors: Mapping[str, str] | None = None,
) -> str:
    """epsilon_emp against epsilon_theory and epsilon_exact, per epsilon audited."""
    plt = pyplot()
    colors = _series_style(runs, colors)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    theory = sorted({r.epsilon_theory for r in rows if r.epsilon_theory is not None})
    if not theory:
        ax.text(0.5, 0.5, "no estimates", ha="center")
        return png(fig)
    top = max(theory) * 1.25
    ax.plot([0, top], [0, top], label="ε theory (claimed)", **_THEORY)
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
                label="ε exact (the reported mechanism)" if len(exact_curves) == 1 else None,
                **_EXACT,
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
    legend_outside(fig, [ax])
    return png(fig)


def _rate_bounds(est: Estimate) -> tuple[float, float, float, float] | None:
    """(FPR_upper, FNR_upper, FPR, FNR) of one estimate, at its per-interval confidence."""
    try:
        fp, fn = int(est.fp), int(est.fn)  # type: ignore[arg-type]
        n_neg, n_pos = int(est.extra["n_neg"]), int(est.extra["n_pos"])
        conf = float(est.confidence)  # type: ignore[arg-type]
        split = str(est.extra.get("split", "bonferroni"))
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


def plot_tradeoff(runs: Sequence[RunData], colors: Mapping[str, str] | None = None) -> str:
    """Per epsilon: (FPR_upper, FNR_upper) points against the exact Gaussian mu curve."""
    plt = pyplot()
    colors = _series_style(runs, colors)
    eps_all = sorted({float(s.epsilon_theory or 0.0) for rd in runs for s in rd.results.settings})
    if not eps_all:
        return _no_estimates(plt)
    fig, panels, every = _panels(plt, len(eps_all), 5.2)
    x = np.linspace(0.0, 1.0, 801)
    for ax, eps in zip(panels, eps_all, strict=True):
        drawn_mu: set[float] = set()
        delta = None
        for rd in runs:
            for s in rd.results.settings:
                if float(s.epsilon_theory or 0.0) != eps:
                    continue
                delta = float(s.extra.get("delta", rd.plan.mechanism.delta))
                sigma = num(s.extra.get("sigma"))
                sens = num(s.extra.get("sensitivity")) or VOTING_SENSITIVITY
                if sigma and sigma > 0:
                    mu = round(sens / sigma, 6)
                    if mu not in drawn_mu:
                        drawn_mu.add(mu)
                        f = stats.norm.cdf(stats.norm.ppf(1 - x) - mu)
                        ax.plot(x, f, color="0.3", lw=2, label=f"exact Gaussian curve, μ={mu:.3g}")
                for threat, key in THREATS:
                    est = s.estimate(key)
                    if est is None or not est.keys or est.error is not None:
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
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.92, hspace=0.3, wspace=0.2)
    fig.suptitle(
        "Trade-off: filled = Clopper-Pearson upper bounds used by the estimate, hollow = "
        "point estimates",
        fontsize=9,
    )
    legend_outside(fig, every)
    return png(fig)


def plot_trials(
    runs: Sequence[RunData],
    curves: Mapping[str, Any],
    *,
    simulated: bool,
    colors: Mapping[str, str] | None = None,
) -> str:
    """Per epsilon: epsilon_emp against the number of trials, with theory and exact lines;
    only the runs whose trials are real (``simulated=False``) or simulated (bootstrap)."""
    colors = _series_style(runs, colors)  # from every run: a run keeps its colour
    runs = [rd for rd in runs if rd.simulated == simulated]
    plt = pyplot()
    eps_map: dict[float, str] = {}
    for rd in runs:
        for s in rd.results.settings:
            eps_map[float(s.epsilon_theory or 0.0)] = str(s.setting)
    eps_all = sorted(eps_map)
    if not eps_all:
        return _no_estimates(plt)
    fig, panels, every = _panels(plt, len(eps_all), 4.4)
    for ax, eps in zip(panels, eps_all, strict=True):
        exacts: set[float] = set()
        ymax = eps * 1.2
        counts: list[float] = []
        for rd in runs:
            for s in rd.results.settings:
                if float(s.epsilon_theory or 0.0) != eps:
                    continue
                ex = num(s.epsilon_exact)
                if ex is not None:
                    exacts.add(round(ex, 6))
                per = curves.get(rd.run_id, {}).get(str(s.setting), {})
                for threat, _key in THREATS:
                    pts = per.get(threat) or []
                    pts = [(t, v) for t, v in pts if math.isfinite(v)]
                    if not pts:
                        continue
                    ts, vs = zip(*pts, strict=True)
                    counts.extend(float(t) for t in ts)
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
        ax.axhline(eps, label="ε theory", **_THEORY)
        for i, ex in enumerate(sorted(exacts)):
            ax.axhline(ex, label="ε exact" if i == 0 else None, **_EXACT)
        ax.set_xscale("log")
        _log_ticks(ax, counts)
        ax.set_ylim(0, ymax)
        ax.set_xlabel(
            "simulated trials (bootstrap, both worlds)" if simulated else "real trials (queries)"
        )
        ax.set_ylabel("ε emp (lower bound)")
        ax.set_title(f"ε theory = {eps:g}")
        ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.95, hspace=0.35, wspace=0.2)
    legend_outside(fig, every)
    return png(fig)
