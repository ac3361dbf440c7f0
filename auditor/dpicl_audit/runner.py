"""Running audits: real-query audits, bootstrap audits (Algorithm 1), resume, estimates.

A **run** (``kind="run"``) audits with real queries. For every epsilon of the plan it creates
the neighbour contexts C1 (canary at position i) and C0 (a replacement there) on the server,
then sends ``plan.trials`` audit queries, each to C1 or C0 as the trial schedule says. The
schedule (the world of every trial index) is drawn from the plan's seed, so it is the same
after a restart; each trial is logged with its observation (black-box: the released label;
white-box: the noisy votes from ``/v1/debug/classify`` too). Estimates per epsilon:

* black-box: the released label is the positive answer -> "present"; Clopper-Pearson,
  Gaussian-DP and classical bounds (:func:`~dpicl_audit.estimators.estimate_from_counts`);
* white-box: ``noisy[pos] - noisy[neg] > tau`` (paper 000, Section 3.2) with ``tau`` chosen
  on a seeded ``plan.split`` share of the trials and the bound computed on the rest
  (:func:`~dpicl_audit.estimators.split_threshold_estimate`); the in-sample value is kept,
  labelled optimistic. A white-box run reports the black-box estimate too (the released
  label is part of every debug answer);
* epsilon_theory from the plan, epsilon_exact from the sigma the server reports for the
  context (dp-accounting PLD, :func:`~dpicl_audit.estimators.voting_epsilon_exact`), and the
  server's own epsilon_exact beside it.

A **bootstrap** run (``kind="bootstrap"``) creates the same contexts, collects
``bootstrap.n_llm`` clean vote vectors per world from ``/v1/debug/classify`` (the server must
run with ``DPICL_WHITEBOX=internal``), logs them as trials of the setting ``clean``, and then
simulates ``bootstrap.n_sample`` noisy trials per world and epsilon with the server's sigma
(:func:`~dpicl_audit.bootstrap.bootstrap_voting_audit`), for both threat models. Clean votes
do not depend on epsilon, so one collection serves every epsilon.

**Resume.** Contexts are recorded in the run (and named ``dpicl-audit <run> <setting> C<w>``
on the server, so one created just before a crash is found again); trials are written in
batches, each batch one transaction, with idempotent inserts. :func:`resume_audit` runs only
the trial indices missing from the log. A run killed at any point (SIGKILL included)
therefore finishes with every index exactly once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import platform
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from dpicl_audit import __version__
from dpicl_audit.canaries import AuditDesign, build_design, context_body
from dpicl_audit.client import AuditTarget, DpiclClient
from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import (
    AuditError,
    InvalidAuditInput,
    InvalidPlan,
    TargetError,
    TargetNotFound,
    TargetProtocolError,
    TargetUnavailable,
)
from dpicl_audit.generation import (
    GenerationDesign,
    build_generation_design,
    estimate_generation_bootstrap,
    generation_context_body,
    generation_meta,
    generation_trial,
    resolve_signal_embeddings,
    signal_tightness,
)
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import ContextRecord, TrialRecord, TrialStore

__all__ = [
    "CLEAN_SETTING",
    "AuditRunner",
    "bootstrap_audit",
    "estimate_run",
    "new_run_id",
    "print_results",
    "results_table",
    "resume_audit",
    "run_audit",
    "trial_worlds",
    "write_results",
]

RunKind = Literal["run", "bootstrap"]
CLEAN_SETTING = "clean"

# Independent random streams derived from the plan's seed (the design uses its own).
STREAM_SCHEDULE = 0x5C_4ED0
STREAM_SPLIT = 0x5B_1170
STREAM_BOOTSTRAP = 0xB0_0757

_TOL = 1e-9

Design = AuditDesign | GenerationDesign


def load_design(data: Mapping[str, Any]) -> Design:
    """A stored design: private voting's, or ESA's (``design_kind == "generation"``)."""
    if data.get("design_kind") == "generation":
        return GenerationDesign.from_json(data)
    return AuditDesign.from_json(data)


def _calls_per_query(plan: AuditPlan) -> int:
    """LLM calls behind one query: T partitions (+ T_cand zero-shot candidates for ESA)."""
    m = plan.mechanism
    return m.partitions + (m.candidates if m.name == "esa" else 0)


def new_run_id() -> str:
    """``audit-YYYYmmdd-HHMMSS-xxxxxx`` (UTC), unique enough for one trial log."""
    return f"audit-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def trial_worlds(seed: int, setting_index: int, n: int) -> npt.NDArray[np.int8]:
    """The world (1 = C1, 0 = C0) of every trial index: fair coins from the plan's seed."""
    rng = np.random.default_rng([seed, STREAM_SCHEDULE, setting_index])
    return rng.integers(0, 2, size=n).astype(np.int8)


def clean_worlds(n_llm: int) -> npt.NDArray[np.int8]:
    """Bootstrap collection: indices alternate C1, C0, C1, ... (n_llm of each)."""
    return (1 - np.arange(2 * n_llm) % 2).astype(np.int8)


# ====================================================================== progress


class RateColumn(ProgressColumn):
    """Trials per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("-- /s", style="progress.data.speed")
        return Text(f"{speed:,.1f} /s", style="progress.data.speed")


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


# ====================================================================== the runner


@dataclass
class _Buffer:
    records: list[TrialRecord] = field(default_factory=list)


class AuditRunner:
    """Executes one run of the trial log against one target.

    Use :func:`run_audit`, :func:`bootstrap_audit` and :func:`resume_audit` rather than this
    class directly; it is public for tests and embedding.
    """

    def __init__(
        self,
        store: TrialStore,
        target: AuditTarget,
        *,
        run_id: str,
        plan: AuditPlan,
        design: Design,
        kind: RunKind,
        progress: bool = True,
        console: Console | None = None,
    ) -> None:
        self.store = store
        self.target = target
        self.run_id = run_id
        self.plan = plan
        self.design = design
        self.kind = kind
        self.console = console or Console(stderr=True)
        self.show_progress = progress
        self._buffer = _Buffer()
        self._flush_lock = asyncio.Lock()
        self._last_flush = time.monotonic()

    # ------------------------------------------------------------------ contexts

    def _context_name(self, setting: str, world: int) -> str:
        return f"dpicl-audit {self.run_id} {setting} C{world}"

    async def ensure_contexts(self, setting: str, epsilon: float) -> dict[int, ContextRecord]:
        """C1 and C0 for one epsilon: the recorded ones if the server still has them,
        else one the server holds under the run's name, else newly created."""
        recorded = self.store.contexts(self.run_id)
        out: dict[int, ContextRecord] = {}
        listing: list[dict[str, Any]] | None = None
        for world in (1, 0):
            rec = recorded.get((setting, world))
            if rec is not None:
                try:
                    await self.target.get_context(rec.context_id)
                    out[world] = rec
                    continue
                except TargetNotFound:
                    self.console.print(
                        f"[yellow]context {rec.context_id} ({setting}, C{world}) is gone from "
                        "the server; creating an identical one[/yellow]"
                    )
            name = self._context_name(setting, world)
            if listing is None:
                try:
                    listing = await self.target.list_contexts()
                except TargetError:
                    listing = []
            info = next((c for c in listing if c.get("name") == name), None)
            if info is None:
                if isinstance(self.design, GenerationDesign):
                    body = generation_context_body(
                        self.design, self.plan, epsilon, world, name=name
                    )
                else:
                    body = context_body(self.design, self.plan, epsilon, world, name=name)
                info = await self.target.create_context(body)
            self._check_context(info, epsilon)
            self.store.save_context(
                self.run_id,
                setting=setting,
                world=world,
                epsilon=epsilon,
                context_id=str(info["id"]),
                info=info,
            )
            out[world] = self.store.contexts(self.run_id)[(setting, world)]
        s1, s0 = _sigma_of(out[1].info), _sigma_of(out[0].info)
        if not math.isclose(s1, s0, rel_tol=1e-9):
            raise TargetProtocolError(
                f"C1 and C0 of {setting} report different sigma ({s1} and {s0}); the "
                "neighbouring contexts must share one mechanism"
            )
        return out

    def _check_context(self, info: Mapping[str, Any], epsilon: float) -> None:
        mech = info.get("mechanism")
        if not isinstance(mech, Mapping):
            raise TargetProtocolError(f"context {info.get('id')} has no mechanism record")
        _sigma_of(info)
        seed = mech.get("partition_seed")
        if seed is not None and int(seed) != self.design.partition_seed:
            raise TargetProtocolError(
                f"context {info.get('id')} has partition_seed {seed}, the audit asked for "
                f"{self.design.partition_seed}: the neighbours would not differ in one partition"
            )
        eps = mech.get("epsilon")
        if eps is not None and not math.isclose(float(eps), epsilon, rel_tol=1e-12):
            raise TargetProtocolError(
                f"context {info.get('id')} has epsilon {eps}, the audit asked for {epsilon}"
            )

    # ------------------------------------------------------------------ trials

    async def _flush(self) -> None:
        async with self._flush_lock:
            batch = self._buffer.records
            self._buffer.records = []
            now = time.monotonic()
            wall = now - self._last_flush
            self._last_flush = now
            if not batch and wall <= 0:
                return
            await asyncio.to_thread(
                self.store.add_trials,
                self.run_id,
                batch,
                wall_time_s=wall,
                llm_calls_per_trial=_calls_per_query(self.plan),
            )

    async def _one_trial(
        self,
        setting: str,
        epsilon: float | None,
        index: int,
        world: int,
        context: ContextRecord,
        *,
        white: bool,
        need_clean: bool,
    ) -> TrialRecord:
        if isinstance(self.design, GenerationDesign):
            return await generation_trial(
                self.target,
                self.design,
                self.plan,
                setting=setting,
                epsilon=epsilon,
                index=index,
                world=world,
                context=context,
                white=white,
                need_clean=need_clean,
            )
        query = self.design.query
        t0 = time.perf_counter()
        if white:
            out = await self.target.debug_classify(context.context_id, query)
        else:
            out = await self.target.classify(context.context_id, query)
        latency = time.perf_counter() - t0
        label = str(out["label"])
        observation: dict[str, Any] = {"label": label}
        score: float | None = None
        if white:
            noisy = _votes(out.get("noisy_votes"), "noisy_votes")
            observation["noisy_votes"] = noisy
            observation["sigma"] = out.get("sigma")
            try:
                score = self.design.score(noisy)
            except KeyError as exc:
                raise TargetProtocolError(f"/v1/debug/classify: {exc.args[0]}") from exc
            clean = out.get("clean_votes")
            if clean is not None:
                observation["clean_votes"] = _votes(clean, "clean_votes")
            elif need_clean:
                raise TargetProtocolError(
                    "/v1/debug/classify returned no clean_votes: bootstrap auditing needs a "
                    "server started with DPICL_WHITEBOX=internal"
                )
        return TrialRecord(
            setting=setting,
            trial_index=index,
            world=world,
            context_id=context.context_id,
            query=query,
            observation=observation,
            decision=self.design.decide_label(label),
            latency_s=latency,
            epsilon=epsilon,
            score=score,
        )

    async def run_trials(
        self,
        setting: str,
        epsilon: float | None,
        worlds: npt.NDArray[np.int8],
        contexts: Mapping[int, ContextRecord],
        *,
        white: bool,
        need_clean: bool = False,
        progress: Progress,
        description: str,
        pick: Callable[[int, int], ContextRecord] | None = None,
    ) -> None:
        """Run the indices of ``worlds`` that the log lacks, with bounded concurrency.

        ``pick(index, world)``, when given, chooses the context of each trial instead of
        ``contexts[world]`` (the bootstrap spreads its clean collection over the epsilons).
        """
        done = self.store.trial_indices(self.run_id, setting)
        missing = [i for i in range(len(worlds)) if i not in done]
        task: TaskID = progress.add_task(description, total=len(worlds), completed=len(done))
        if not missing:
            return
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in missing:
            queue.put_nowait(i)
        batch = self.plan.batch_size

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                world = int(worlds[i])
                rec = await self._one_trial(
                    setting,
                    epsilon,
                    i,
                    world,
                    contexts[world] if pick is None else pick(i, world),
                    white=white,
                    need_clean=need_clean,
                )
                self._buffer.records.append(rec)
                progress.advance(task)
                if len(self._buffer.records) >= batch:
                    await self._flush()

        n_workers = min(self.plan.concurrency, len(missing))
        workers = [asyncio.create_task(worker()) for _ in range(n_workers)]
        try:
            finished, pending = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for t in finished:
                exc = t.exception()
                if exc is not None:
                    raise exc
        finally:
            # Completed trials are kept whatever happened to the others.
            await asyncio.shield(self._flush())

    # ------------------------------------------------------------------ run kinds

    async def execute(self) -> dict[str, Any]:
        """Run (or continue) every missing part of this run, then estimate and save."""
        self.store.update_run(self.run_id, status="running", error=None)
        self._last_flush = time.monotonic()
        try:
            with _progress(self.console, self.show_progress) as progress:
                if self.kind == "run":
                    await self._execute_trials(progress)
                else:
                    await self._execute_bootstrap_collection(progress)
            await self._flush()
            t0 = time.monotonic()
            results = await asyncio.to_thread(estimate_run, self.store, self.run_id)
            self.store.add_usage(self.run_id, wall_time_s=time.monotonic() - t0)
            results = _finish(self.store, self.run_id, results)
        except AuditError as exc:
            await self._flush()
            self.store.update_run(self.run_id, status="failed", error=str(exc))
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            await asyncio.shield(self._flush())
            self.store.update_run(self.run_id, status="interrupted")
            raise
        return results

    async def _signal_embeddings(self, contexts: Mapping[int, ContextRecord]) -> None:
        """ESA: learn e(y1), e(y0) once (see dpicl_audit.generation) and record them."""
        if not isinstance(self.design, GenerationDesign):
            return
        if self.design.signal_embeddings() is not None:
            return
        self.design = await resolve_signal_embeddings(self.target, self.design, self.plan, contexts)
        self.store.update_run(self.run_id, design=self.design.to_json())

    async def _execute_trials(self, progress: Progress) -> None:
        white = self.plan.threat_model == "white-box"
        for k, eps in enumerate(self.plan.mechanism.epsilons):
            setting = self.plan.setting_key(eps)
            contexts = await self.ensure_contexts(setting, eps)
            if white or self.plan.generation.embeddings != "server":
                await self._signal_embeddings(contexts)
            await self.run_trials(
                setting,
                eps,
                trial_worlds(self.plan.seed, k, self.plan.trials),
                contexts,
                white=white,
                progress=progress,
                description=f"{setting} {self.plan.threat_model}",
            )

    async def _execute_bootstrap_collection(self, progress: Progress) -> None:
        per_eps: list[dict[int, ContextRecord]] = []
        for eps in self.plan.mechanism.epsilons:
            per_eps.append(await self.ensure_contexts(self.plan.setting_key(eps), eps))
        await self._signal_embeddings(per_eps[0])

        def pick(index: int, world: int) -> ContextRecord:
            # Clean votes do not depend on epsilon, so pair j (indices 2j, 2j+1) goes to the
            # contexts of epsilon j mod K: the same clean rows serve every epsilon, and every
            # epsilon's noisy votes feed its own noise check (dpicl_audit.noise_check).
            return per_eps[(index // 2) % len(per_eps)][world]

        await self.run_trials(
            CLEAN_SETTING,
            None,
            clean_worlds(self.plan.bootstrap.n_llm),
            per_eps[0],
            white=True,
            need_clean=True,
            progress=progress,
            description=(
                "clean means" if isinstance(self.design, GenerationDesign) else "clean votes"
            ),
            pick=pick,
        )


# ====================================================================== estimates


def _sigma_of(info: Mapping[str, Any]) -> float:
    mech = info.get("mechanism")
    try:
        sigma = float(mech["sigma"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError) as exc:
        raise TargetProtocolError(
            f"context {info.get('id')} reports no mechanism.sigma; the audit needs the noise "
            "the server uses"
        ) from exc
    if not (sigma > 0 and math.isfinite(sigma)):
        raise TargetProtocolError(f"context {info.get('id')} reports sigma {sigma}")
    return sigma


def _votes(value: Any, name: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise TargetProtocolError(f"/v1/debug/classify returned no {name} mapping")
    try:
        return {str(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError(f"/v1/debug/classify: {name} holds non-numbers") from exc


def _verdict(
    epsilon_lower: float, epsilon_theory: float, epsilon_exact: float | None
) -> dict[str, Any]:
    """Compare a lower bound (already at the audit's confidence) with the claims."""
    exceeds_theory = epsilon_lower > epsilon_theory * (1 + _TOL) + _TOL
    exceeds_exact = epsilon_exact is not None and epsilon_lower > epsilon_exact + 1e-6
    if exceeds_theory:
        status, message = (
            "violation",
            f"PRIVACY VIOLATION: the audit proves epsilon >= {epsilon_lower:.3f} at its "
            f"confidence, above the claimed epsilon {epsilon_theory:g}",
        )
    elif exceeds_exact:
        status, message = (
            "bug",
            f"epsilon_emp {epsilon_lower:.3f} exceeds the mechanism's exact epsilon "
            f"{epsilon_exact:.3f}: the server or the auditor has a bug",
        )
    else:
        status, message = "ok", "consistent with the claimed privacy"
    return {
        "status": status,
        "violation": exceeds_theory,
        "exceeds_exact": exceeds_exact,
        "message": message,
    }


def _setting_meta(
    plan: AuditPlan, epsilon: float, contexts: Mapping[tuple[str, int], ContextRecord]
) -> dict[str, Any]:
    setting = plan.setting_key(epsilon)
    c1, c0 = contexts.get((setting, 1)), contexts.get((setting, 0))
    meta: dict[str, Any] = {
        "setting": setting,
        "epsilon_theory": epsilon,
        "delta": plan.mechanism.delta,
        "partitions": plan.mechanism.partitions,
        "calibration": plan.mechanism.calibration,
        "context_ids": {"C1": c1.context_id if c1 else None, "C0": c0.context_id if c0 else None},
        "sigma": None,
        "epsilon_exact": None,
        "epsilon_exact_server": None,
    }
    if c1 is not None:
        sigma = _sigma_of(c1.info)
        mech = c1.info.get("mechanism", {})
        meta["sigma"] = sigma
        meta["sensitivity"] = mech.get("sensitivity")
        from dpicl_audit.estimators import voting_epsilon_exact  # dp-accounting: slow import

        meta["epsilon_exact"] = voting_epsilon_exact(sigma, plan.mechanism.delta)
        meta["epsilon_exact_server"] = mech.get("epsilon_exact")
    return meta


def _with_verdict(est: dict[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    est["verdict"] = _verdict(
        float(est["epsilon_lower"]), float(meta["epsilon_theory"]), meta["epsilon_exact"]
    )
    return est


def _estimate_trials(
    plan: AuditPlan,
    k: int,
    rows: Sequence[TrialRecord],
    meta: dict[str, Any],
    *,
    positive_when: Literal["above", "below"] = "above",
    finish: Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]] = _with_verdict,
) -> dict[str, Any]:
    """Per-epsilon estimates of a real-query run: black-box from the logged decisions,
    white-box from the logged scores (voting: noisy vote gap, positive above the threshold;
    ESA: distance difference, positive below it)."""
    from dpicl_audit.estimators import estimate_from_counts, split_threshold_estimate

    out = dict(meta)
    worlds = np.array([r.world for r in rows], dtype=np.int64)
    decisions = np.array([r.decision or 0 for r in rows], dtype=np.int64)
    n1, n0 = int(np.sum(worlds == 1)), int(np.sum(worlds == 0))
    out |= {
        "trials": len(rows),
        "n_with": n1,
        "n_without": n0,
        "llm_calls": len(rows) * _calls_per_query(plan),
    }
    tp = int(np.sum(decisions[worlds == 1]))
    fp = int(np.sum(decisions[worlds == 0]))
    try:
        bb = estimate_from_counts(
            tp, n1 - tp, fp, n0 - fp, delta=plan.mechanism.delta, confidence=plan.confidence
        ).to_dict()
        out["black_box"] = finish(bb, meta)
    except InvalidAuditInput as exc:
        out["black_box"] = {"error": str(exc)}
    out["white_box"] = None
    scores = [r.score for r in rows]
    if plan.threat_model == "white-box" and rows and all(s is not None for s in scores):
        arr = np.array(scores, dtype=np.float64)
        try:
            wb = split_threshold_estimate(
                arr[worlds == 1],
                arr[worlds == 0],
                rng=np.random.default_rng([plan.seed, STREAM_SPLIT, k]),
                fraction=plan.split,
                confidence=plan.confidence,
                delta=plan.mechanism.delta,
                positive_when=positive_when,
            ).to_dict()
            out["white_box"] = finish(wb, meta)
        except InvalidAuditInput as exc:
            out["white_box"] = {"error": str(exc)}
    return out


def _estimate_bootstrap(
    plan: AuditPlan,
    design: AuditDesign,
    k: int,
    clean: Sequence[TrialRecord],
    meta: dict[str, Any],
) -> dict[str, Any]:
    from dpicl_audit.bootstrap import bootstrap_voting_audit  # slow imports: only when needed
    from dpicl_audit.noise_check import check_noise, residuals_from_observations

    out = dict(meta)
    with_rows = [design.clean_vector(r.observation["clean_votes"]) for r in clean if r.world == 1]
    without_rows = [
        design.clean_vector(r.observation["clean_votes"]) for r in clean if r.world == 0
    ]
    pos = design.labels.index(design.positive)
    if design.negative is not None:
        neg = design.labels.index(design.negative)
    else:  # Brainwash: the strongest competitor in the clean votes
        totals = np.sum(np.array(with_rows + without_rows, dtype=np.float64), axis=0)
        totals[pos] = -np.inf
        neg = int(np.argmax(totals))
    n_sample = plan.bootstrap.n_sample
    ids = {cid for cid in meta["context_ids"].values() if cid is not None}
    sigma_sim = meta["sigma"]
    if meta["sigma"] is not None:
        # The simulation trusts the reported sigma only if the real noise agrees with it.
        check = check_noise(
            residuals_from_observations(
                (r.observation for r in clean if r.context_id in ids), design.labels
            ),
            float(meta["sigma"]),
        )
        out["noise_check"] = check.to_dict()
        sigma_sim = check.simulation_sigma
    out["sigma_simulated"] = sigma_sim
    out |= {
        "n_llm": len(with_rows),
        "n_sample": n_sample,
        "trials": 2 * n_sample,
        "llm_calls": len(clean) * plan.mechanism.partitions,
        "positive": design.positive,
        "negative": design.labels[neg],
    }
    if not with_rows or not without_rows or meta["sigma"] is None:
        out["black_box"] = out["white_box"] = {"error": "no clean votes collected"}
        return out
    res = bootstrap_voting_audit(
        np.array(with_rows),
        np.array(without_rows),
        float(sigma_sim),
        n_sample,
        positive_index=pos,
        negative_index=neg,
        delta=plan.mechanism.delta,
        confidence=plan.confidence,
        rng=np.random.default_rng([plan.seed, STREAM_BOOTSTRAP, k]),
        fraction=plan.split,
        calls_per_row=plan.mechanism.partitions,
    ).to_dict()
    out["black_box"] = _with_verdict(res["black_box"], meta)
    out["white_box"] = _with_verdict(res["white_box"], meta)
    return out


def estimate_setting(
    plan: AuditPlan,
    design: Design,
    k: int,
    rows: Sequence[TrialRecord],
    meta: dict[str, Any],
    *,
    bootstrap: bool,
) -> dict[str, Any]:
    """One epsilon setting's estimates from its logged rows (clean vectors for bootstrap
    runs, trials otherwise), for either mechanism family."""
    if isinstance(design, GenerationDesign):
        if bootstrap:
            return estimate_generation_bootstrap(
                plan, design, k, rows, meta, with_verdict=_with_verdict, stream=STREAM_BOOTSTRAP
            )
        return _estimate_trials(
            plan,
            k,
            rows,
            meta,
            positive_when="below",
            finish=lambda est, m: signal_tightness(_with_verdict(est, m), m),
        )
    if bootstrap:
        return _estimate_bootstrap(plan, design, k, rows, meta)
    return _estimate_trials(plan, k, rows, meta)


def estimate_run(store: TrialStore, run_id: str) -> dict[str, Any]:
    """Results of a run from its log: per-epsilon estimates next to theory and exact."""
    run = store.get_run(run_id)
    plan = AuditPlan.from_public(run.plan)
    if run.design is None:
        raise InvalidAuditInput(f"run {run_id} has no design recorded")
    design = load_design(run.design)
    contexts = store.contexts(run_id)
    settings = []
    clean = store.trials(run_id, CLEAN_SETTING) if run.kind == "bootstrap" else []
    for k, eps in enumerate(plan.mechanism.epsilons):
        meta = _setting_meta(plan, eps, contexts)
        if isinstance(design, GenerationDesign):
            meta = generation_meta(plan, design, meta, meta["sigma"])
        rows = clean if run.kind == "bootstrap" else store.trials(run_id, meta["setting"])
        settings.append(
            estimate_setting(plan, design, k, rows, meta, bootstrap=run.kind == "bootstrap")
        )
    run = store.get_run(run_id)
    return {
        "run_id": run_id,
        "kind": run.kind,
        "name": run.name,
        "status": run.status,
        "created_at": run.created_at.isoformat(),
        "plan": run.plan,
        "versions": run.versions,
        "mechanism": plan.mechanism.name,
        "design": _design_summary(design),
        "confidence": plan.confidence,
        "delta": plan.mechanism.delta,
        "threat_models": (
            ["black-box", "white-box"]
            if run.kind == "bootstrap" or plan.threat_model == "white-box"
            else ["black-box"]
        ),
        "settings": settings,
        "queries": run.queries,
        "llm_calls": run.llm_calls,
        "wall_time_s": run.wall_time_s,
    }


def _design_summary(design: Design) -> dict[str, Any]:
    if isinstance(design, GenerationDesign):
        return {
            "attack": design.attack,
            "canary_kind": design.canary_kind,
            "canary": design.canary.input,
            "canary_label": design.canary.output,
            "position": design.position,
            "partition_seed": design.partition_seed,
            "labels": [design.y1, design.y0],
            "positive": design.y1,
            "negative": design.y0,
            "signal": design.signal,
            "signal_distance": design.signal_distance(),
            "embeddings_source": design.embeddings_source,
            "query": design.query,
        }
    return {
        "attack": design.attack,
        "canary_kind": design.canary_kind,
        "canary": design.canary.input,
        "canary_label": design.canary.output,
        "position": design.position,
        "partition_seed": design.partition_seed,
        "labels": list(design.labels),
        "positive": design.positive,
        "negative": design.negative,
        "query": design.query,
    }


def _finish(store: TrialStore, run_id: str, results: dict[str, Any]) -> dict[str, Any]:
    store.update_run(run_id, status="completed", results=_jsonable(results))
    run = store.get_run(run_id)
    results |= {
        "status": run.status,
        "queries": run.queries,
        "llm_calls": run.llm_calls,
        "wall_time_s": run.wall_time_s,
    }
    store.update_run(run_id, results=_jsonable(results))
    return results


def _jsonable(value: Any) -> Any:
    """Replace non-finite floats (JSON has none) by strings, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    return value


def write_results(results: Mapping[str, Any], out_dir: str | Path) -> Path:
    """``<out_dir>/<run_id>/results.json``."""
    path = Path(out_dir) / str(results["run_id"]) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(results), indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


# ====================================================================== presentation


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    v = float(value)
    if math.isinf(v):
        return "inf"
    return f"{v:.{digits}f}"


def results_table(results: Mapping[str, Any]) -> Table:
    """One row per (epsilon, threat model); fits an 80-column terminal."""
    conf = float(results.get("confidence", 0.95))
    kind = results.get("kind", "run")
    table = Table(
        title=f"dpicl audit {results['run_id']} ({kind}, {results['design']['attack']})",
        caption=(
            "ε: as configured; exact: the mechanism's true ε (PLD)\n"
            f"ε emp (Gaussian-DP), classic: lower bounds at {conf:.0%} confidence, "
            f"δ={results.get('delta')}\nwhite-box thresholds chosen on held-out splits"
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    columns = (
        ("ε", "left"),
        ("threat", "left"),
        ("exact", "right"),
        ("ε emp", "right"),
        ("μ low", "right"),
        ("classic", "right"),
        ("TPR", "right"),
        ("FPR", "right"),
        ("n", "right"),
        ("verdict", "left"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    models = results.get("threat_models", ["black-box"])
    for s in results["settings"]:
        for model in models:
            est = s.get("black_box" if model == "black-box" else "white_box")
            if not est:
                continue
            threat = model.removesuffix("-box")
            eps = f"{float(s.get('epsilon_theory', 0.0)):g}"
            if "error" in est:
                table.add_row(eps, threat, *["-"] * 7, Text(str(est["error"]), style="red"))
                continue
            status = est.get("verdict", {}).get("status", "")
            style = {"violation": "bold red", "bug": "bold yellow", "ok": "green"}.get(status, "")
            table.add_row(
                eps,
                threat,
                _fmt(s.get("epsilon_exact")),
                _fmt(est.get("epsilon_lower")),
                _fmt(est.get("mu_lower")),
                _fmt(est.get("epsilon_lower_classic")),
                _fmt(est.get("tpr"), 2),
                _fmt(est.get("fpr"), 2),
                str(s.get("trials", "-")),
                Text(status, style=style),
            )
    return table


def print_results(results: Mapping[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(results_table(results))
    for s in results["settings"]:
        for key in ("black_box", "white_box"):
            est = s.get(key)
            if est and est.get("verdict", {}).get("status") in ("violation", "bug"):
                console.print(
                    f"[bold red]{s['setting']} {key.replace('_', '-')}: "
                    f"{est['verdict']['message']}[/bold red]"
                )
    console.print(
        f"{results.get('queries', 0)} queries, {results.get('llm_calls', 0)} LLM calls, "
        f"{_fmt(results.get('wall_time_s'), 1)} s wall time"
    )


# ====================================================================== entry points


def _versions(health: Mapping[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    import httpx
    import scipy
    import sqlalchemy

    out: dict[str, Any] = {
        "auditor": __version__,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "packages": {
            "httpx": httpx.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "sqlalchemy": sqlalchemy.__version__,
        },
        "server": dict(health) if health is not None else {"error": error},
    }
    try:
        from importlib import metadata

        out["packages"]["dp-accounting"] = metadata.version("dp-accounting")
    except Exception:
        pass
    return out


async def _health(client: AuditTarget) -> tuple[dict[str, Any] | None, str | None]:
    """The server's /healthz; an unreachable server stops the audit before it starts."""
    try:
        return await client.health(), None
    except TargetUnavailable:
        raise
    except TargetError as exc:  # a server without /healthz can still be audited
        return None, str(exc)


@contextmanager
def _opened_store(
    store: TrialStore | None, db: str | Path | None, schema: str | None
) -> Iterator[TrialStore]:
    if store is not None:
        yield store
        return
    own = TrialStore(db, schema=schema)
    try:
        yield own
    finally:
        own.dispose()


def _client_for(plan: AuditPlan) -> DpiclClient:
    t = plan.target
    return DpiclClient(
        t.base_url,
        admin_token=t.admin_token.get_secret_value() if t.admin_token else None,
        api_key=t.api_key.get_secret_value() if t.api_key else None,
        concurrency=plan.concurrency,
        timeout=plan.timeout,
        retries=plan.retries,
    )


async def _start(
    plan: AuditPlan,
    kind: RunKind,
    *,
    db: str | Path | None,
    schema: str | None,
    store: TrialStore | None,
    run_id: str | None,
    target: AuditTarget | None,
    out_dir: str | Path,
    progress: bool,
    console: Console | None,
) -> dict[str, Any]:
    if plan.target.admin_token is None:
        raise InvalidPlan(
            "the audit needs the server's admin token (target.admin_token, --admin-token or "
            "DPICL_AUDIT_ADMIN_TOKEN) to create its canary contexts"
        )
    design: Design = (
        build_generation_design(plan, load_dataset(plan.dataset))
        if plan.mechanism.name == "esa"
        else build_design(plan, load_dataset(plan.dataset))
    )
    own_client = target is None
    client: AuditTarget = target if target is not None else _client_for(plan)
    try:
        health, herr = await _health(client)
        with _opened_store(store, db, schema) as st:
            rid = run_id or new_run_id()
            st.create_run(
                rid,
                plan=plan.public_dump(),
                versions=_versions(health, herr),
                kind=kind,
                name=plan.name,
                design=design.to_json(),
            )
            runner = AuditRunner(
                st,
                client,
                run_id=rid,
                plan=plan,
                design=design,
                kind=kind,
                progress=progress,
                console=console,
            )
            results = await runner.execute()
    finally:
        if own_client and isinstance(client, DpiclClient):
            await client.aclose()
    write_results(results, out_dir)
    return results


async def run_audit(
    plan: AuditPlan,
    *,
    db: str | Path | None = None,
    schema: str | None = None,
    store: TrialStore | None = None,
    run_id: str | None = None,
    target: AuditTarget | None = None,
    out_dir: str | Path = "runs",
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Audit with real queries (see the module docstring); returns the results dict."""
    return await _start(
        plan,
        "run",
        db=db,
        schema=schema,
        store=store,
        run_id=run_id,
        target=target,
        out_dir=out_dir,
        progress=progress,
        console=console,
    )


async def bootstrap_audit(
    plan: AuditPlan,
    *,
    db: str | Path | None = None,
    schema: str | None = None,
    store: TrialStore | None = None,
    run_id: str | None = None,
    target: AuditTarget | None = None,
    out_dir: str | Path = "runs",
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Audit with Algorithm 1 of paper 000 (clean votes + simulated noise)."""
    return await _start(
        plan,
        "bootstrap",
        db=db,
        schema=schema,
        store=store,
        run_id=run_id,
        target=target,
        out_dir=out_dir,
        progress=progress,
        console=console,
    )


async def resume_audit(
    run_id: str,
    *,
    db: str | Path | None = None,
    schema: str | None = None,
    store: TrialStore | None = None,
    admin_token: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    target: AuditTarget | None = None,
    out_dir: str | Path = "runs",
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Continue a run from its log: only missing trial indices are run.

    Tokens are never stored, so they come again from the arguments (CLI flags or the
    environment); ``base_url`` may point the run at the server's new address.
    """
    with _opened_store(store, db, schema) as st:
        run = st.get_run(run_id)
        plan = AuditPlan.from_public(
            run.plan, admin_token=admin_token, api_key=api_key, base_url=base_url
        )
        if run.design is None:
            raise InvalidAuditInput(f"run {run_id} has no recorded design; it cannot resume")
        design = load_design(run.design)
        if target is None and plan.target.admin_token is None:
            raise InvalidPlan(
                f"resuming {run_id} needs the server's admin token (--admin-token or "
                "DPICL_AUDIT_ADMIN_TOKEN); tokens are never stored in the trial log"
            )
        own_client = target is None
        client: AuditTarget = target if target is not None else _client_for(plan)
        try:
            health, herr = await _health(client)
            versions = dict(run.versions)
            resumes = list(versions.get("resumed", []))
            resumes.append(
                {"at": dt.datetime.now(dt.UTC).isoformat(), "server": health or {"error": herr}}
            )
            versions["resumed"] = resumes
            st.update_run(run_id, versions=versions)
            kind: RunKind = "bootstrap" if run.kind == "bootstrap" else "run"
            runner = AuditRunner(
                st,
                client,
                run_id=run_id,
                plan=plan,
                design=design,
                kind=kind,
                progress=progress,
                console=console,
            )
            results = await runner.execute()
        finally:
            if own_client and isinstance(client, DpiclClient):
                await client.aclose()
    write_results(results, out_dir)
    return results
