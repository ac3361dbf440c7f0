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

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, cast

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table
from scipy.stats import binomtest

from dpicl_audit.errors import RunNotFound
from dpicl_audit.jsontypes import JsonMapping, json_object
from dpicl_audit.utility.estimators import accuracy_interval, bootstrap_interval
from dpicl_audit.utility.plan import FEW_SHOT, MAJORITY, ZERO_SHOT, UtilityPlan
from dpicl_audit.utility.results import (
    Finding,
    IntervalJson,
    UtilityResults,
    UtilityRow,
    metric_of,
)

if TYPE_CHECKING:
    from dpicl_audit.store import TrialRecord, TrialStore

__all__ = [
    "ALPHA",
    "BOOTSTRAP_STREAM",
    "ONE_LABEL_SHARE",
    "degenerate_findings",
    "degenerate_verdict",
    "majority_row",
    "print_utility",
    "stored_refusals",
    "summarise",
    "summarise_trials",
    "utility_results",
]

#: The bootstrap's random stream (with the plan's seed and the cell's position): a report
#: recomputed from the log gives the same intervals.
BOOTSTRAP_STREAM = 0xB0_07_57_0E
#: A cell that gives one label to at least this share of its answers answers "one label to
#: nearly everything" (a finding).
ONE_LABEL_SHARE = 0.9
#: The level of the one-sided exact binomial test against the majority-class rate.
ALPHA = 0.05


def _spent(records: list[TrialRecord]) -> dict[int, float]:
    """Each draw's context spend (the largest spent_epsilon its answers reported)."""
    out: dict[int, float] = defaultdict(float)
    for r in records:
        spent = json_object(r.observation.get("budget")).get("spent_epsilon")
        if isinstance(spent, int | float):
            out[r.world] = max(out[r.world], float(spent))
    return dict(out)


def summarise_trials(
    records: list[TrialRecord],
    plan: UtilityPlan,
    *,
    refused: dict[str, str] | None = None,
) -> UtilityResults:
    """The results of a utility run from its trials (pure: same trials, same results)."""
    by_cell: dict[str, list[TrialRecord]] = defaultdict(list)
    for r in records:
        by_cell[r.setting].append(r)
    rows: list[UtilityRow] = []
    per_draw: dict[int, float] = defaultdict(float)
    for k, cell in enumerate(plan.cells()):
        recs = sorted(by_cell.get(cell.name, []), key=lambda r: r.trial_index)
        row: UtilityRow = {
            "setting": cell.name,
            "kind": cell.kind,
            "epsilon": cell.epsilon if cell.kind == "private" else None,
            "partitions": cell.partitions if cell.kind == "private" else None,
            "queries": len(recs),
            "planned": plan.queries,
        }
        how = next((r.observation.get("route") for r in recs if r.observation.get("route")), None)
        if how:
            row["measured_by"] = str(how)
        if refused and cell.name in refused:
            row["refused"] = refused[cell.name]
        if recs:
            if plan.task == "classification":
                correct = sum(int(r.decision or 0) for r in recs)
                row["accuracy"] = accuracy_interval(correct, len(recs)).to_json()
                # What it answered: a model that answers one label scores the share of that
                # label, whatever the inputs (issue 45: "Business" to 40 of 40 queries).
                answers = Counter(str(r.observation.get("label")) for r in recs)
                row["answers"] = dict(answers.most_common())
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
    findings: list[Finding] = []
    degenerate = None
    if plan.task == "classification":
        majority = majority_row(records, plan.queries)
        if majority is not None:
            rows.insert(0, majority)
            findings = degenerate_findings(rows, majority)
            degenerate = degenerate_verdict(rows, findings, plan.dataset)
    return {
        "kind": "utility",
        "task": plan.task,
        "metric": metric,
        "mechanism": plan.mechanism,
        "dataset": plan.dataset,
        "label_calibration": plan.label_calibration,
        "delta": plan.delta,
        "cells": rows,
        "spent_epsilon_per_exemplar": max(per_draw.values()) if per_draw else None,
        "refused": dict(refused or {}),
        "findings": findings,
        "degenerate": degenerate,
    }


def majority_row(records: list[TrialRecord], planned: int) -> UtilityRow | None:
    """The majority-class baseline: the share of the most common label among the held-out
    queries, which answering that one label to every query scores. No query is asked for
    it: the labels are in the log (each answer's ``expected``). It is the best any constant
    answer does on these very queries, so a cell that cannot beat it has learnt nothing a
    constant does not know."""
    expected = {
        r.trial_index: str(r.observation["expected"])
        for r in records
        if r.observation.get("expected") is not None
    }
    if not expected:
        return None
    label, k = Counter(expected.values()).most_common(1)[0]
    n = len(expected)
    return {
        "setting": MAJORITY,
        "kind": MAJORITY,
        "epsilon": None,
        "partitions": None,
        "queries": n,
        "planned": planned,
        "label": label,
        "accuracy": accuracy_interval(k, n).to_json(),
        "measured_by": f"no query: always answering {label!r}, the most common label of the "
        f"{n} held-out queries ({k} of them)",
    }


def degenerate_findings(rows: list[UtilityRow], majority: UtilityRow) -> list[Finding]:
    """A finding for each measured cell (baselines and private cells) that answers one label
    to nearly everything (at least :data:`ONE_LABEL_SHARE` of its answers), and for each
    whose accuracy cannot be told from the majority-class rate: the one-sided exact binomial
    test of its correct answers against that rate (H0: accuracy <= the majority rate) does
    not reject at level :data:`ALPHA`. The rate is taken as known: it is the constant
    answer's score on the same queries."""
    rate = float(majority["accuracy"]["value"])
    out: list[Finding] = []
    for row in rows:
        if row["kind"] == MAJORITY or "accuracy" not in row or not row.get("answers"):
            continue
        n = int(row["queries"])
        correct = round(float(row["accuracy"]["value"]) * n)
        top, count = max(row["answers"].items(), key=lambda kv: (kv[1], kv[0]))
        share = count / n
        if share >= ONE_LABEL_SHARE:
            out.append(
                {
                    "setting": row["setting"],
                    "kind": "one-label",
                    "label": top,
                    "share": share,
                    "message": f"{row['setting']} answered {top!r} to {count} of {n} queries "
                    f"({share:.0%}): it says next to nothing about the inputs",
                }
            )
        p = float(binomtest(correct, n, min(max(rate, 0.0), 1.0), alternative="greater").pvalue)
        row["vs_majority"] = {"p_value": p, "above": p < ALPHA, "rate": rate}
        if p >= ALPHA:
            out.append(
                {
                    "setting": row["setting"],
                    "kind": "at-majority",
                    "p_value": p,
                    "message": f"{row['setting']}: accuracy {correct}/{n} = {correct / n:.3f} "
                    f"cannot be told from the majority-class rate {rate:.3f} (always "
                    f"{majority['label']!r}; one-sided exact binomial test, p = {p:.2g})",
                }
            )
    return out


def degenerate_verdict(rows: list[UtilityRow], findings: list[Finding], dataset: str) -> str | None:
    """One sentence when the model is degenerate on the dataset: its best measured answer
    (the non-private few-shot baseline, else every private cell) is a constant in effect, so
    the private cells cannot show a privacy-utility trade-off, only noise around it. Where
    the few-shot baseline beats the majority rate but every private cell is no better than
    it, the sentence says so (degenerate under privacy: the loss is the noise's and the
    partitions', not the model's). None when a private cell beats the majority rate."""
    flagged = {f["setting"] for f in findings}
    few = next((r for r in rows if r["kind"] == "few-shot" and "accuracy" in r), None)
    private = [r for r in rows if r["kind"] == "private" and "accuracy" in r]
    all_private = bool(private) and all(r["setting"] in flagged for r in private)
    major = next(r for r in rows if r["kind"] == MAJORITY)
    constant = f"always answering {major['label']!r} ({float(major['accuracy']['value']):.3f})"
    if few is not None and few["setting"] in flagged:
        return f"DEGENERATE on {dataset}: few-shot (non-private) is no better than {constant}"
    if not all_private:
        return None
    if few is None:
        return f"DEGENERATE on {dataset}: every private cell is no better than {constant}"
    return (
        f"DEGENERATE on {dataset} under privacy: every private cell is no better than "
        f"{constant}, though few-shot (non-private) beats it "
        f"({float(few['accuracy']['value']):.3f})"
    )


#: What a degenerate verdict means, printed under it.
DEGENERATE_MEANS = (
    "The model is in effect a constant on this dataset: the private cells show noise around "
    "that constant, not a privacy-utility trade-off. Choose a dataset where few-shot beats "
    "the majority rate (docs/utility.md)."
)


def summarise(
    store: TrialStore, run_id: str, plan: UtilityPlan, *, refused: dict[str, str] | None = None
) -> UtilityResults:
    """:func:`summarise_trials` over a run's logged trials; ``refused`` defaults to what the
    stored results said."""
    if refused is None:
        refused = stored_refusals(store.get_run(run_id).results)
    out = summarise_trials(store.trials(run_id), plan, refused=refused)
    out["run_id"] = run_id
    return out


def stored_refusals(results: JsonMapping | None) -> dict[str, str]:
    """The cells a run's stored results say were refused, each with why."""
    refused = json_object((results or {}).get("refused"))
    return {cell: str(why) for cell, why in refused.items()}


def _interval(v: IntervalJson | None) -> str:
    if not v:
        return "-"
    return f"{v['value']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"


#: The table title's word for a run's label calibration (voting's ``label_calibration``).
_CALIBRATED = {"content-free": " (content-free calibrated)", "exemplars": " (exemplar calibrated)"}


def print_utility(results: UtilityResults, console: Console) -> None:
    """The per-cell table, baselines first."""
    metric = results["metric"]
    # The interval's kind is said under the table: the column stays narrow enough for 80.
    title = "accuracy [95% CI]" if metric == "accuracy" else "ROUGE-L [95% CI]"
    table = Table(
        title=f"utility of {results['mechanism']}"
        + _CALIBRATED.get(str(results.get("label_calibration")), "")
        + f" on {results['dataset']} ({results.get('run_id', '')})",
        box=box.SIMPLE_HEAVY,
    )
    for col in ("setting", "epsilon", "T", title, "queries", "spent eps"):
        table.add_column(col, justify="left" if col in ("setting", title) else "right")
    degenerate = results.get("degenerate")
    if degenerate:  # one line first: the table below shows noise around a constant
        console.print(f"[bold red]{degenerate}[/bold red]", highlight=False)
        console.print(DEGENERATE_MEANS, highlight=False)
    cells = results["cells"]
    baselines = (MAJORITY, ZERO_SHOT, FEW_SHOT)
    order = [c for b in baselines for c in cells if c["setting"] == b]
    order += [c for c in cells if c["setting"] not in baselines]
    for c in order:
        shown = _interval(metric_of(c, metric)) if "refused" not in c else "not offered"
        spent = c.get("spent_epsilon")
        if c["kind"] == MAJORITY:
            spent = None
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
            console.print(f"{c['setting']}: {c['measured_by']}", highlight=False)
    for name, why in results.get("refused", {}).items():
        console.print(f"{name}: not measured: {why}", highlight=False)
    for f in results.get("findings") or []:
        console.print(f"[yellow]{f['message']}[/yellow]", highlight=False)
    per = results.get("spent_epsilon_per_exemplar")
    if per is not None:
        console.print(
            f"ledger: each exemplar draw paid at most epsilon {per:.2f} over the private cells "
            f"(sum of its contexts' spend, delta {results['delta']:g} each)",
            highlight=False,
        )


def utility_results(store: TrialStore, run_ids: list[str]) -> dict[str, UtilityResults]:
    """The results of those of ``run_ids`` that are utility runs: as stored when the run
    completed, else recomputed from its log (a run still going, or stopped)."""
    out: dict[str, UtilityResults] = {}
    for rid in run_ids:
        try:
            run = store.get_run(rid)
        except RunNotFound:
            continue  # the audit's loader says so
        if run.kind != "utility":
            continue
        # Stored from a UtilityResults (runner.run_utility), read back as written.
        stored = None if run.results is None else cast(UtilityResults, dict(run.results))
        if stored is not None and "findings" in stored:
            out[rid] = stored
        elif stored is not None:
            # Stored before the majority baseline and its findings (issue 45): recomputed
            # from the log, with what the run stored of its refusals and contexts.
            plan = UtilityPlan.model_validate({**run.plan, "target": {}})
            refused = dict(stored.get("refused") or {})
            out[rid] = stored | summarise(store, rid, plan, refused=refused)
        else:
            plan = UtilityPlan.model_validate({**run.plan, "target": {}})
            out[rid] = summarise(store, rid, plan, refused={})
    return out
