"""The utility audit's life: plan, contexts, queries over HTTP into the SQL trial log, results.

It reuses the audit's plumbing: the client (dpicl's routes, or ``--api openai`` with a
``--context-hook``), the trial log (:class:`~dpicl_audit.store.TrialStore`, runs of kind
``utility``), the progress bars and the budgets of :mod:`dpicl_audit.estimators.composition`.

In the trial log a cell is a *setting* (``eps=4,T=8``, ``few-shot``, ``zero-shot``), a query's
index is its *trial index*, and the *world* column holds the exemplar draw the query went to
(``run_contexts`` keeps one context per (cell, draw)). Trials are written in batches, each
insert idempotent, so a run killed at any point and resumed (``dpicl-audit utility --resume
RUN``) loses and duplicates nothing: answers not yet committed are asked again, on contexts
whose budget has a margin for it. Contexts are created (or adopted by name after a crash)
lazily, recorded, and deleted when the run completes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Console

from dpicl_audit.client import DpiclClient
from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import (
    InvalidPlan,
    TargetNotFound,
    TargetProtocolError,
    TargetRejected,
)
from dpicl_audit.estimators.composition import answers_in_budget, planned_queries
from dpicl_audit.jsontypes import JsonMapping, JsonObject, json_object
from dpicl_audit.pipeline.progress import open_progress
from dpicl_audit.pipeline.session import (
    client_for,
    run_versions,
    server_health,
    with_budget_limit,
)
from dpicl_audit.plan.specs import TargetSpec
from dpicl_audit.store import TrialRecord, TrialStore
from dpicl_audit.utility.contexts import RunContexts
from dpicl_audit.utility.estimators import rouge_l
from dpicl_audit.utility.plan import Cell, UtilityPlan, draw_split
from dpicl_audit.utility.report import stored_refusals, summarise
from dpicl_audit.utility.results import UtilityResults

__all__ = ["KIND", "UtilityRun", "estimate_seconds", "run_utility"]

KIND = "utility"
_FLUSH_EVERY = 8
_FLUSH_SECONDS = 2.0


def _baseline_client(plan: UtilityPlan, target: DpiclClient) -> DpiclClient | None:
    """The white-box client of the non-private baseline: ``baseline_url``, else the target
    itself when it is dpicl (native routes, or openai without a hook)."""
    t = plan.target
    if plan.baseline_url is None and t.api == "native":
        return target
    url = plan.baseline_url or (t.base_url if t.context_hook is None else None)
    if url is None:
        return None
    admin = t.admin_token.get_secret_value() if t.admin_token else None
    return DpiclClient(url, admin_token=admin, concurrency=plan.concurrency, timeout=plan.timeout)


def estimate_seconds(cells: list[Cell], pending: Mapping[str, int], per_prompt_s: float) -> float:
    """Time of the pending answers at ``per_prompt_s`` seconds per LLM prompt, as measured at
    the run's concurrency (an answer of a T-partition cell is T prompts)."""
    return per_prompt_s * sum(c.prompts_per_query * pending.get(c.name, 0) for c in cells)


@dataclass
class UtilityRun(RunContexts):
    """One utility run's state while it runs: its contexts, and the answers not yet logged."""

    _buffer: list[TrialRecord] = field(default_factory=list)
    _last_flush: float = field(default_factory=time.monotonic)

    # ---------------------------------------------------------------- answers

    async def ask(self, cell: Cell, index: int) -> TrialRecord:
        draw = self.draws.context_of(index)
        rec = await self.context(cell, draw)
        example = self.data.examples[int(self.draws.queries[index])]
        client = self.client(cell)
        start = time.perf_counter()
        obs: JsonObject
        zero_route = cell.kind == "zero-shot" and self.baseline is not None
        if zero_route:
            # dpicl's zero-shot route: the context's template with no exemplar, no charge.
            out = await client.zero_shot(
                rec.context_id,
                example.input,
                self.plan.max_tokens if self.plan.task == "generation" else None,
            )
        if self.plan.task == "classification":
            if zero_route:
                label = out.get("label")
                obs = {"label": label}
            elif cell.kind == "few-shot":
                out = await client.debug_classify(rec.context_id, example.input)
                # T = 1: the one partition's clean vote (None where it abstained); the
                # list is absent where the server's white-box level is only "noisy".
                votes = out.get("partition_votes")
                label = votes[0] if isinstance(votes, list) and votes else None
                obs = {"label": label, "released": out.get("label"), "clean": bool(votes)}
            else:
                out = await client.classify(rec.context_id, example.input)
                label = out.get("label")
                obs = {"label": label}
            obs["expected"] = example.output
            decision: int | None = int(label == example.output)
            score: float | None = None
        else:
            if zero_route:
                text = str(out.get("text") or "")
            elif cell.kind == "few-shot":
                out = await client.debug_generate(
                    rec.context_id, example.input, self.plan.max_tokens
                )
                texts = out.get("partition_texts")
                text = str(texts[0] or "") if isinstance(texts, list) and texts else ""
                obs_extra = {"clean": bool(texts)}
            else:
                out = await client.generate(rec.context_id, example.input, self.plan.max_tokens)
                text = str(out.get("text", ""))
            score = rouge_l(text, example.output)
            obs = {"text": text, "reference": example.output, "rouge_l": score}
            if cell.kind == "few-shot":
                obs |= obs_extra
            decision = None
        obs |= {k: out[k] for k in ("cost", "budget") if k in out}
        obs["route"] = self.route(cell)
        return TrialRecord(
            setting=cell.name,
            trial_index=index,
            world=draw,
            context_id=rec.context_id,
            query=example.input,
            observation=obs,
            decision=decision,
            latency_s=time.perf_counter() - start,
            epsilon=cell.epsilon,
            score=score,
        )

    def keep(self, record: TrialRecord, force: bool = False) -> None:
        self._buffer.append(record)
        now = time.monotonic()
        due = len(self._buffer) >= _FLUSH_EVERY or now - self._last_flush >= _FLUSH_SECONDS
        if self._buffer and (force or due):
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        wall = time.monotonic() - self._last_flush
        self._last_flush = time.monotonic()
        # The LLM prompts behind each answer (T for a private cell, 1 for a baseline), so that
        # `list` counts them (issue 45: utility runs listed "calls 0"): one insert per cell.
        prompts = {c.name: c.prompts_per_query for c in self.plan.cells()}
        groups: dict[str, list[TrialRecord]] = {}
        for rec in batch:
            groups.setdefault(rec.setting, []).append(rec)
        for k, (setting, recs) in enumerate(groups.items()):
            self.store.add_trials(
                self.run_id,
                recs,
                wall_time_s=wall if k == 0 else 0.0,
                llm_calls_per_trial=prompts.get(setting, 1),
            )


def _pending(store: TrialStore, run_id: str, cells: list[Cell], n: int) -> dict[str, list[int]]:
    out = {}
    for c in cells:
        done = store.trial_indices(run_id, c.name)
        out[c.name] = [i for i in range(n) if i not in done]
    return out


def _contexts_needed(plan: UtilityPlan, limit: float) -> int:
    """Exemplar draws so that every context's answers fit one budget within ``limit``."""
    need = plan.contexts
    for e in plan.epsilons:
        fit = answers_in_budget(e, plan.delta, limit)
        if fit < planned_queries(1):
            raise InvalidPlan(
                f"epsilon {e:g}: one budget within the server's limit ({limit:g}) holds "
                f"{fit} answers; audit smaller epsilons"
            )
        # The most answers a context is asked: ceil(queries / draws), with the retry margin.
        while planned_queries(math.ceil(plan.queries / need)) > fit:
            need += 1
    return need


async def run_utility(
    plan: UtilityPlan | None,
    *,
    store: TrialStore,
    run_id: str,
    console: Console,
    progress: bool = True,
    resume: bool = False,
    overrides: JsonMapping | None = None,
) -> UtilityResults:
    """Run (or, with ``resume``, continue) a utility audit; return its results."""
    if resume:
        stored = store.get_run(run_id)
        if stored.kind != KIND:
            raise InvalidPlan(f"run {run_id!r} is a {stored.kind} run; `dpicl-audit resume` it")
        base = UtilityPlan.model_validate({**stored.plan, "target": {}})
        spec = _with_overrides(
            TargetSpec.model_validate(_unmasked(json_object(stored.plan.get("target")))),
            overrides or {},
        )
        plan = base.model_copy(update={"target": spec})
    if plan is None:
        raise InvalidPlan("no plan to run")
    data = load_dataset(plan.dataset)
    if plan.task == "classification" and len(data.labels) < 2:
        raise InvalidPlan(f"dataset {plan.dataset!r} has fewer than 2 labels")
    target = client_for(plan)
    baseline: DpiclClient | None = None
    try:
        health, err = await server_health(target)
        if not resume:
            plan = plan.model_copy(update={"target": with_budget_limit(plan.target, health)})
            limit = plan.target.max_budget_epsilon or 1000.0
            plan = plan.model_copy(update={"contexts": _contexts_needed(plan, limit)})
            store.create_run(
                run_id,
                plan=plan.stored(),
                versions=run_versions(health, err),
                kind=KIND,
                design={"dataset": data.name, "examples": len(data), "labels": list(data.labels)},
            )
        else:
            store.update_run(run_id, status="running", error=None)
        baseline = _baseline_client(plan, target)
        draws = draw_split(len(data), plan)
        run = UtilityRun(run_id, plan, store, target, baseline, data, draws, console)
        # A completed run resumed asks nothing, so its refusals are the stored ones.
        run.refused.update(stored_refusals(store.get_run(run_id).results))
        try:
            results = await _execute(run, progress)
        except (asyncio.CancelledError, KeyboardInterrupt):
            run.flush()
            store.update_run(run_id, status="interrupted")
            raise
        except Exception as exc:
            run.flush()
            store.update_run(run_id, status="failed", error=str(exc)[:2000])
            raise
        gone = await run.delete_contexts()
        results["contexts_deleted"] = gone
        store.update_run(run_id, status="completed", results=results)
        return results
    finally:
        if baseline is not None and baseline is not target:
            await baseline.aclose()
        await target.aclose()


async def _execute(run: UtilityRun, progress: bool) -> UtilityResults:
    plan, console = run.plan, run.console
    cells = plan.cells()
    if plan.baselines and run.baseline is None:
        cells = [c for c in cells if c.kind != "few-shot"]
        run.refused["few-shot"] = (
            "needs a white-box dpicl server over the same model (--baseline-url)"
        )
    pending = _pending(run.store, run.run_id, cells, plan.queries)
    cells = await _probe_baselines(run, cells, pending)
    pending = {c.name: pending[c.name] for c in cells}  # a refused baseline asks nothing
    total = sum(len(v) for v in pending.values())
    whole = len(cells) * plan.queries
    # The baselines' first answers (their checks) are logged already: the count says so, so
    # that it agrees with the bar's n/n at the end (issue 45: "238 answers to ask", "240/240").
    logged = f"{whole - total} logged already, {total} to ask" if whole - total else "all to ask"
    console.print(
        f"utility audit {run.run_id}: {len(cells)} cells x {plan.queries} queries = {whole} "
        f"answers ({logged}) on {plan.dataset}, {plan.contexts} exemplar draws of "
        f"{plan.exemplars}",
        highlight=False,
    )
    if total:
        # The time estimate comes from real answers (logged as trials): as many of the first
        # cell's as go in flight at once, so that it measures the server's throughput at
        # this concurrency (a batching server answers several in about the time of one).
        first = next(c for c in cells if pending[c.name])
        # Two rounds: the first one's answers create the cell's contexts and fill the
        # server's prefix cache, so they are slow; the estimate comes from the second (issue
        # 45: estimates from the first round alone were 1.8 and 2.1 times too long in two runs
        # here, 2.3-2.8 in the issue).
        rounds = [pending[first.name][: plan.concurrency]]
        rounds.append(pending[first.name][len(rounds[0]) : 2 * len(rounds[0])])
        took, timed = 0.0, rounds[0]
        for probe in rounds:
            if not probe:
                break
            del pending[first.name][: len(probe)]
            t0 = time.perf_counter()
            for rec in await asyncio.gather(*(run.ask(first, i) for i in probe)):
                run.keep(rec)
            run.flush()
            took, timed = time.perf_counter() - t0, probe
        probe = [i for r in rounds for i in r]
        per_prompt = took / (len(timed) * first.prompts_per_query)
        left = {k: len(v) for k, v in pending.items()}
        eta = estimate_seconds(cells, left, per_prompt)
        console.print(
            f"{len(probe)} answers asked; {len(timed)} after the first round took {took:.1f} s "
            f"({first.name}, {plan.concurrency} in flight); the other {sum(left.values())} "
            f"should take about {eta / 60:.1f} min",
            highlight=False,
        )
    sem = asyncio.Semaphore(plan.concurrency)
    # One bar over every answer: the cells run one after another through the semaphore, so
    # a bar per cell would show an ETA that counts the time spent on the cells before it.
    done = len(cells) * plan.queries - sum(len(v) for v in pending.values())
    with open_progress(console, progress) as bars:
        task = bars.add_task("answers", total=len(cells) * plan.queries, completed=done)

        async def one(cell: Cell, i: int) -> None:
            async with sem:
                rec = await run.ask(cell, i)
            run.keep(rec)
            bars.advance(task)

        jobs = [one(c, i) for c in cells for i in pending[c.name]]
        try:
            await asyncio.gather(*jobs)
        finally:
            run.flush()
    return summarise(run.store, run.run_id, plan, refused=run.refused)


async def _probe_baselines(
    run: UtilityRun, cells: list[Cell], pending: dict[str, list[int]]
) -> list[Cell]:
    """Drop the baselines the endpoint does not offer, saying why: zero-shot where the dpicl
    server has no ``/v1/zero-shot`` (or, behind a hook with no dpicl server beside it, where
    the deployment refuses a context without exemplars), few-shot where its white-box
    endpoint is off or not ``internal``. A baseline's first answer is its check (and is
    logged like any other)."""
    keep = []
    for c in cells:
        if c.kind == "private" or not pending[c.name]:
            keep.append(c)
            continue
        try:
            record = await run.ask(c, pending[c.name][0])
        except TargetNotFound as exc:
            # The context was found a moment before (it was resolved, or created, for this
            # answer): a 404 here is the route's, on a dpicl server older than it.
            why = str(exc)  # whole: it names the setting to change (issue 45: cut at 300)
            if c.kind == "zero-shot" and run.baseline is not None:
                why = f"the server has no POST /v1/zero-shot (a dpicl before it): {why}"
            run.refused[c.name] = why
            continue
        except (TargetRejected, TargetProtocolError) as exc:
            run.refused[c.name] = str(exc)
            continue
        if c.kind == "few-shot" and not _has_clean_answer(record):
            run.refused[c.name] = (
                "the baseline server's /v1/debug answers without the partitions' clean "
                "outputs: start it with DPICL_WHITEBOX=internal"
            )
            continue
        run.keep(record, force=True)
        pending[c.name].pop(0)
        keep.append(c)
    return keep


def _has_clean_answer(record: TrialRecord) -> bool:
    return bool(record.observation.get("clean", False))


def _with_overrides(stored: TargetSpec, overrides: JsonMapping) -> TargetSpec:
    """The stored target with what the caller gives again (tokens are never stored; a server
    may have moved)."""
    update = {k: v for k, v in overrides.items() if v is not None}
    return TargetSpec.model_validate(stored.model_dump() | update)


def _unmasked(target: JsonMapping) -> JsonObject:
    """A stored target without its masked tokens."""
    return {k: v for k, v in target.items() if k not in ("admin_token", "api_key")}
