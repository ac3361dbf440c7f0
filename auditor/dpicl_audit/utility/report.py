"""The utility audit's results, computed from the trial log alone, and their table.

Per cell: the accuracy with its 95% Clopper-Pearson interval (classification) or the mean
ROUGE-L with its 95% percentile bootstrap interval (generation), the number of queries, and
the budget the evaluation spent according to the server's ledger: each answer reports its
context's ``budget.spent_epsilon`` (the exact composition of what that context answered), so
a context's spend is the largest it reported, and a cell's the largest over its contexts.
The same exemplar draw serves every cell, so what one draw's exemplars paid over the whole
evaluation is the sum over the cells of its contexts' spend (basic composition, an upper
bound): ``spent_epsilon_per_exemplar`` is the largest such sum over the draws.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from dpicl_audit.errors import RunNotFound
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.utility.estimators import accuracy_interval, bootstrap_interval
from dpicl_audit.utility.plan import FEW_SHOT, ZERO_SHOT, UtilityPlan

if TYPE_CHECKING:
    from dpicl_audit.store import TrialRecord, TrialStore

__all__ = [
    "BOOTSTRAP_STREAM",
    "print_utility",
    "summarise",
    "summarise_trials",
    "utility_results",
]

#: The bootstrap's random stream (with the plan's seed and the cell's position): a report
#: recomputed from the log gives the same intervals.
BOOTSTRAP_STREAM = 0xB0_07_57_0E


def _spent(records: list[TrialRecord]) -> dict[int, float]:
    """Each draw's context spend (the largest spent_epsilon its answers reported)."""
    out: dict[int, float] = defaultdict(float)
    for r in records:
        budget = r.observation.get("budget")
        if isinstance(budget, dict) and isinstance(budget.get("spent_epsilon"), int | float):
            out[r.world] = max(out[r.world], float(budget["spent_epsilon"]))
    return dict(out)


def summarise_trials(
    records: list[TrialRecord],
    plan: UtilityPlan,
    *,
    refused: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The results of a utility run from its trials (pure: same trials, same results)."""
    by_cell: dict[str, list[TrialRecord]] = defaultdict(list)
    for r in records:
        by_cell[r.setting].append(r)
    rows: list[dict[str, Any]] = []
    per_draw: dict[int, float] = defaultdict(float)
    for k, cell in enumerate(plan.cells()):
        recs = sorted(by_cell.get(cell.name, []), key=lambda r: r.trial_index)
        row: dict[str, Any] = {
            "setting": cell.name,
            "kind": cell.kind,
            "epsilon": cell.epsilon if cell.kind == "private" else None,
            "partitions": cell.partitions if cell.kind == "private" else None,
            "queries": len(recs),
            "planned": plan.queries,
        }
        how = next((r.observation.get("route") for r in recs if r.observation.get("route")), None)
        if how:
            row["measured_by"] = how
        if refused and cell.name in refused:
            row["refused"] = refused[cell.name]
        if recs:
            if plan.task == "classification":
                correct = sum(int(r.decision or 0) for r in recs)
                row["accuracy"] = accuracy_interval(correct, len(recs)).to_json()
            else:
                scores = np.array([float(r.score or 0.0) for r in recs])
                rng = np.random.default_rng([plan.seed, BOOTSTRAP_STREAM, k])
                row["rouge_l"] = bootstrap_interval(scores, rng).to_json()
            spent = _spent(recs)
            row["spent_epsilon"] = max(spent.values()) if spent else None
            row["contexts"] = len({r.context_id for r in recs})
            if cell.kind == "private":
                for draw, eps in spent.items():
                    per_draw[draw] += eps
        rows.append(row)
    metric = "accuracy" if plan.task == "classification" else "rouge_l"
    return {
        "kind": "utility",
        "task": plan.task,
        "metric": metric,
        "mechanism": plan.mechanism,
        "dataset": plan.dataset,
        "delta": plan.delta,
        "cells": rows,
        "spent_epsilon_per_exemplar": max(per_draw.values()) if per_draw else None,
        "refused": dict(refused or {}),
    }


def summarise(
    store: TrialStore, run_id: str, plan: UtilityPlan, *, refused: dict[str, str] | None = None
) -> JsonObject:
    """:func:`summarise_trials` over a run's logged trials; ``refused`` defaults to what the
    stored results said."""
    if refused is None:
        stored = store.get_run(run_id).results or {}
        refused = dict(stored.get("refused") or {})
    out = summarise_trials(store.trials(run_id), plan, refused=refused)
    out["run_id"] = run_id
    return out


def _interval(v: Mapping[str, Any] | None) -> str:
    if not v:
        return "-"
    return f"{v['value']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"


def print_utility(results: Mapping[str, Any], console: Console) -> None:
    """The per-cell table, baselines first."""
    metric = results["metric"]
    # The interval's kind is said under the table: the column stays narrow enough for 80.
    title = "accuracy [95% CI]" if metric == "accuracy" else "ROUGE-L [95% CI]"
    table = Table(
        title=f"utility of {results['mechanism']} on {results['dataset']} "
        f"({results.get('run_id', '')})",
        box=box.SIMPLE_HEAVY,
    )
    for col in ("setting", "epsilon", "T", title, "queries", "spent eps"):
        table.add_column(col, justify="left" if col in ("setting", title) else "right")
    cells = results["cells"]
    order = [c for c in cells if c["setting"] in (ZERO_SHOT, FEW_SHOT)]
    order += [c for c in cells if c["setting"] not in (ZERO_SHOT, FEW_SHOT)]
    for c in order:
        shown = _interval(c.get(metric)) if "refused" not in c else "not offered"
        spent = c.get("spent_epsilon")
        table.add_row(
            c["setting"],
            "-" if c["epsilon"] is None else f"{c['epsilon']:g}",
            "-" if c["partitions"] is None else str(c["partitions"]),
            shown,
            f"{c['queries']}/{c['planned']}",
            "-" if spent is None else f"{spent:.2f}",
        )
    console.print(table)
    how = "Clopper-Pearson (exact)" if metric == "accuracy" else "percentile bootstrap"
    console.print(
        f"intervals: 95% {how}; spent eps: the largest a cell's contexts reported "
        "(budget.spent_epsilon of the server's ledger)",
        highlight=False,
    )
    for c in order:
        if c["kind"] != "private" and c.get("measured_by"):
            console.print(f"{c['setting']}: {c['measured_by']}", highlight=False, soft_wrap=True)
    for name, why in results.get("refused", {}).items():
        console.print(f"{name}: not measured: {why}", highlight=False, soft_wrap=True)
    per = results.get("spent_epsilon_per_exemplar")
    if per is not None:
        console.print(
            f"ledger: each exemplar draw paid at most epsilon {per:.2f} over the private cells "
            f"(sum of its contexts' spend, delta {results['delta']:g} each)",
            highlight=False,
        )


def utility_results(store: TrialStore, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The results of those of ``run_ids`` that are utility runs: as stored when the run
    completed, else recomputed from its log (a run still going, or stopped)."""
    out: dict[str, dict[str, Any]] = {}
    for rid in run_ids:
        try:
            run = store.get_run(rid)
        except RunNotFound:
            continue  # the audit's loader says so
        if run.kind != "utility":
            continue
        if run.results is not None:
            out[rid] = dict(run.results)
        else:
            plan = UtilityPlan.model_validate({**run.plan, "target": {}})
            out[rid] = summarise(store, rid, plan, refused={})
    return out
