"""The contexts of a utility run: one per (cell, exemplar draw), budgeted for the answers
it will give (with the retry margin of :mod:`dpicl_audit.estimators.composition`), recorded in the
trial log's ``run_contexts`` (the draw in its ``world`` column) and named
``dpicl-audit <run> <cell> #<draw>`` on the server. A context is reused when the log records it
and the server still has it, adopted by its name when a crash came between its creation and
the log, created otherwise, and deleted when the run completes. The baselines' contexts live
on the baseline server (the target itself on dpicl's routes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Console

from dpicl_audit.client import ContextBody, DpiclClient
from dpicl_audit.context_info import context_info
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import TargetError, TargetNotFound
from dpicl_audit.estimators.composition import budget_for, planned_queries
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.store import ContextRecord, TrialStore
from dpicl_audit.utility.plan import FEW_SHOT, ZERO_SHOT, Cell, Draws, UtilityPlan

__all__ = ["RunContexts"]


def calibration_note(plan: UtilityPlan, cell: Cell) -> str:
    """How a baseline's label scores were calibrated, in words: the server calibrates the
    zero-shot answer by the content-free input, and not at all under "exemplars" (it has no
    exemplar to estimate a bias from)."""
    mode = plan.label_calibration
    if plan.task != "classification" or mode == "none":
        return ""
    if mode == "content-free":
        return "; calibrated by the content-free input 'N/A'"
    if cell.kind == "zero-shot":
        return "; uncalibrated (no exemplars to calibrate by)"
    return "; calibrated by the draw's own exemplars (batch calibration)"


@dataclass
class RunContexts:
    """A utility run's contexts: one per (cell, exemplar draw)."""

    run_id: str
    plan: UtilityPlan
    store: TrialStore
    target: DpiclClient
    baseline: DpiclClient | None
    data: LabelledDataset
    draws: Draws
    console: Console
    refused: dict[str, str] = field(default_factory=dict)
    _locks: dict[tuple[str, int], asyncio.Lock] = field(default_factory=dict)
    _cache: dict[tuple[str, int], ContextRecord] = field(default_factory=dict)
    _listings: dict[int, list[JsonObject]] = field(default_factory=dict)

    # ---------------------------------------------------------------- contexts

    def context_name(self, cell: Cell, draw: int) -> str:
        return f"dpicl-audit {self.run_id} {cell.name} #{draw}"

    def answers_per_context(self, draw: int) -> int:
        return sum(1 for i in range(self.plan.queries) if self.draws.context_of(i) == draw)

    def body(self, cell: Cell, draw: int) -> ContextBody:
        """The ``POST /v1/contexts`` body of one (cell, draw), budgeted for its answers."""
        plan = self.plan
        examples = [self.data.examples[int(k)] for k in self.draws.contexts[draw]]
        # A zero-shot answer comes from dpicl's /v1/zero-shot, which leaves the context's
        # exemplars out (a dpicl context holds at least one); a deployment behind a hook with
        # no dpicl server beside it is asked for a context without exemplars instead.
        empty = cell.kind == "zero-shot" and self.baseline is None
        exemplars = [] if empty else [_ex(e) for e in examples]
        mech: JsonObject = {
            "name": plan.mechanism,
            "epsilon": cell.epsilon,
            "delta": plan.delta,
            "partitions": cell.partitions,
            "partition_seed": plan.seed,
        }
        if plan.task == "generation" and plan.max_tokens is not None:  # ESA: its length
            mech["max_tokens"] = plan.max_tokens
        if plan.task == "classification" and plan.label_calibration != "none":
            # Sent only when asked: a server before the option keeps working for the rest.
            mech["label_calibration"] = plan.label_calibration
        limit = self.plan.target.max_budget_epsilon or 1000.0
        answers = planned_queries(self.answers_per_context(draw))
        body: ContextBody = {
            "name": self.context_name(cell, draw),
            "task": plan.task or "classification",  # set by the plan from the dataset
            "exemplars": exemplars,
            "mechanism": mech,
            "budget": budget_for(cell.epsilon, plan.delta, answers, limit),
        }
        if plan.task == "classification":
            body["labels"] = list(self.data.labels)
        return body

    async def context(self, cell: Cell, draw: int) -> ContextRecord:
        key = (cell.name, draw)
        if key in self._cache:
            return self._cache[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._cache:
                self._cache[key] = await self._resolve(cell, draw)
            return self._cache[key]

    def client(self, cell: Cell) -> DpiclClient:
        """Who answers a cell: the target for the private cells; the white-box server (the
        target itself on dpicl's routes) for the baselines, where there is one."""
        if cell.kind == "few-shot":
            assert self.baseline is not None  # cells without one are refused before
            return self.baseline
        if cell.kind == "zero-shot" and self.baseline is not None:
            return self.baseline
        return self.target

    def route(self, cell: Cell) -> str:
        """How a cell's answers are measured, in words (the results say it per baseline)."""
        classify = self.plan.task == "classification"
        client = self.client(cell)
        mine, theirs = (str(getattr(c, "base_url", "")).rstrip("/") for c in (client, self.target))
        # With --api openai the baselines go to the same server's native routes through a
        # client of their own: still the target, not "the baseline server" (issue 45).
        if client is self.target:
            where = "the target"
        elif mine and mine == theirs and self.plan.baseline_url is None:
            where = "the target (its native route)"
        else:
            where = f"the baseline server {mine}".rstrip()
        if cell.kind == "few-shot":
            path = "/v1/debug/classify" if classify else "/v1/debug/generate"
            return (
                f"POST {path} on {where}: the clean answer of one partition holding every "
                "exemplar of the draw (T=1, no noise; DPICL_WHITEBOX=internal)"
                + calibration_note(self.plan, cell)
            )
        if cell.kind == "zero-shot":
            if self.baseline is not None:
                return (
                    f"POST /v1/zero-shot on {where}: the context's template and labels with "
                    "no exemplar (no noise, no privacy charge)" + calibration_note(self.plan, cell)
                )
            return "the target's chat completions on a context without exemplars (its hook)"
        if self.plan.target.api == "openai":
            return "POST /v1/chat/completions on the target"
        return f"POST {'/v1/classify' if classify else '/v1/generate'} on the target"

    async def _resolve(self, cell: Cell, draw: int) -> ContextRecord:
        client = self.client(cell)
        rec = self.store.contexts(self.run_id).get((cell.name, draw))
        if rec is not None:
            try:
                await client.get_context(rec.context_id)
                return rec
            except TargetNotFound:
                self.console.print(
                    f"[yellow]context {rec.context_id} ({cell.name} #{draw}) is gone; "
                    "creating it again[/yellow]"
                )
        body = self.body(cell, draw)
        info: Mapping[str, object] | None = await self._adoptable(client, str(body["name"]))
        if info is None:
            info = await client.create_context(body)
        record = context_info(info)
        self.store.save_context(
            self.run_id,
            setting=cell.name,
            world=draw,
            epsilon=cell.epsilon,
            context_id=record["id"],
            info=record,
        )
        return self.store.contexts(self.run_id)[(cell.name, draw)]

    async def _adoptable(self, client: DpiclClient, name: str) -> JsonObject | None:
        """A context the run created before a crash let it reach the log (by its name)."""
        listing = self._listings.get(id(client))
        if listing is None:
            try:
                listing = await client.list_contexts()
            except TargetError:
                listing = []
            self._listings[id(client)] = listing
        return next((c for c in listing if c.get("name") == name), None)

    async def delete_contexts(self) -> int:
        gone = 0
        for (setting, _), rec in self.store.contexts(self.run_id).items():
            client = self.target
            if setting in (FEW_SHOT, ZERO_SHOT) and self.baseline is not None:
                client = self.baseline
            with contextlib.suppress(TargetError):
                await client.delete_context(rec.context_id)
                gone += 1
        return gone


def _ex(e: Example) -> dict[str, str]:
    return {"input": e.input, "output": e.output}
