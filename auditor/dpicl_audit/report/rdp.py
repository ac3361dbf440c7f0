"""The report's Renyi-DP part (paper 003): a table row per setting and the paper's two plots.

1. Privacy leakage per adversary as bars (Figures 3/4 of 003): the composed RDP curves
   converted to epsilon at the plan's delta with Theorem 1 - exact theory, k-cut, 2-cut
   (from the released labels) and Gaussian theory; the conversion is an upper-bound map, so
   for the audit bars it is an illustration, as in the paper. (The data-dependent PATE bound
   is not computed and has no bar.)
2. The composed RDP against the order (Figure 2/6): theory, exact, k-cut and 2-cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpicl_audit.report.data import ReportRow, RunData, num
from dpicl_audit.report.figure import png, pyplot
from dpicl_audit.results import SettingResult

__all__ = ["has_rdp", "plot_rdp_bars", "plot_rdp_curves", "rdp_row"]

_BARS = (
    ("exact", "exact theory"),
    ("k_cut", "k-cut audit"),
    ("two_cut", "2-cut audit"),
    ("two_cut_simulated", "2-cut (simulated from clean votes)"),
)


def has_rdp(runs: Sequence[RunData]) -> bool:
    return any(s.rdp is not None for rd in runs for s in rd.results.settings)


def rdp_row(
    rd: RunData, s: SettingResult, *, conf: float, method: str, wall_time_s: float | None
) -> ReportRow:
    """The table row of one setting's RDP audit (no epsilon_emp: an RDP lower bound does not
    convert to a lower bound on epsilon)."""
    verdict = s.rdp_verdict
    return ReportRow(
        run_id=rd.run_id,
        engine=rd.engine,
        method=method,
        setting=str(s.setting),
        threat="rdp",
        epsilon_theory=num(s.epsilon_theory),
        epsilon_exact=num(s.epsilon_exact),
        epsilon_emp=None,
        mu_lower=None,
        confidence=conf,
        trials=s.trials,
        n_llm=None,
        llm_calls=s.llm_calls,
        wall_time_s=wall_time_s,
        wall_time_shared=False,
        status="" if verdict is None else verdict.status.value,
        message="" if verdict is None else verdict.message,
        noise_check=None,
        mechanism=rd.mechanism,
        attack=rd.plan.attack,
        design=f"paper 003 adversary, {rd.plan.queries} queries",
    )


def _settings(runs: Sequence[RunData]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, the RDP audit's stored keys) of every setting with one."""
    return [
        (f"{rd.plan.attack} {s.setting}", s.rdp.as_mapping())
        for rd in runs
        for s in rd.results.settings
        if s.rdp is not None
    ]


def plot_rdp_bars(runs: Sequence[RunData]) -> str:
    plt = pyplot()
    items = _settings(runs)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(items)), 4.0))
    width = 0.8 / len(_BARS)
    x = np.arange(len(items))
    for j, (key, name) in enumerate(_BARS):
        vals = [num(r["epsilons"].get(key)) for _, r in items]
        ax.bar(x + j * width, [v if v is not None else 0.0 for v in vals], width, label=name)
    theory = [num(r["epsilons"].get("theory")) for _, r in items]
    ax.scatter(x + 0.4 - width / 2, theory, marker="_", s=600, color="k", label="Gaussian theory")
    ax.set_xticks(x + 0.4 - width / 2, [n for n, _ in items], rotation=20, ha="right")
    ax.set_ylabel("privacy leakage ε (Theorem 1)")
    ax.legend(fontsize=8)
    return png(fig)


def plot_rdp_curves(runs: Sequence[RunData]) -> str:
    plt = pyplot()
    items = _settings(runs)
    fig, axes = plt.subplots(1, len(items), figsize=(4.5 * len(items), 3.8), squeeze=False)
    for ax, (name, r) in zip(axes[0], items, strict=True):
        for key, label, style in (
            ("theory", "Gaussian theory", "k--"),
            ("exact", "exact theory", "C0-"),
            ("k_cut", "k-cut audit", "C1o-"),
            ("two_cut", "2-cut audit", "C2s-"),
            ("two_cut_simulated", "2-cut (simulated)", "C3^:"),
        ):
            if r.get(key) is not None:
                ax.plot(r["orders"], r[key], style, label=label, markersize=4)
        ax.set_xscale("log")
        ticks = [a for a in (2, 5, 10, 20, 50) if min(r["orders"]) <= a <= max(r["orders"])]
        ax.set_xticks(ticks, [str(a) for a in ticks])
        ax.minorticks_off()
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel("order α")
        ax.set_ylabel(f"RDP over {r.get('queries')} queries")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    return png(fig)
