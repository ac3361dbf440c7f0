"""Executing one run: its trials (a real-query run) or its clean rows (a bootstrap run, Algorithm
1 of paper 000), then its estimates and results.

A **run** (``kind="run"``) audits with real queries: for every epsilon of the plan it gets
the neighbour contexts C1 and C0 (:class:`~dpicl_audit.pipeline.contexts.ContextBook`) and sends
``plan.trials`` audit queries, each to the world the seeded schedule says
(:func:`~dpicl_audit.plan.schedule.trial_worlds`). A **bootstrap** run (``kind="bootstrap"``)
collects ``bootstrap.n_llm`` clean rows per world from the debug endpoint at ``internal``
(logged as the setting ``clean``) and simulates ``bootstrap.n_sample`` noisy trials per world
and epsilon. What a trial sends and observes, and how it is estimated, is the mechanism
package's business (:mod:`dpicl_audit.mechanisms`); this module only drives the steps, on the
run's one :class:`~dpicl_audit.pipeline.run_context.RunContext`. Its life (opening, starting or
resuming, results written) is :mod:`.run`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from dpicl_audit.errors import AuditError, TargetRejected, TargetUnavailable
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.pipeline.contexts import ContextBook
from dpicl_audit.pipeline.estimation import estimate_run
from dpicl_audit.pipeline.progress import ProgressSink, open_progress
from dpicl_audit.pipeline.results import finish_run
from dpicl_audit.pipeline.run_context import RunContext
from dpicl_audit.pipeline.trials import TrialExecutor
from dpicl_audit.plan.schedule import CLEAN_SETTING, clean_worlds, context_slots, trial_worlds
from dpicl_audit.probes.registry import ALL_PROBES, PROBES
from dpicl_audit.results import RunResult
from dpicl_audit.store import ContextRecord

__all__ = ["AuditRunner"]


class AuditRunner:
    """Executes one run of the trial log against one target (its :class:`RunContext`).

    Use :func:`~dpicl_audit.pipeline.run.run_audit`, :func:`~.run.bootstrap_audit` and
    :func:`~.run.resume_audit` rather than this class directly; it is public for tests,
    benchmarks and embedding.
    """

    def __init__(self, run: RunContext, *, progress: bool = True) -> None:
        self.run_ctx = run
        self.show_progress = progress
        self.contexts = ContextBook(run)
        self.trials = TrialExecutor(run)

    async def execute(self) -> JsonObject:
        """Run (or continue) every missing part of this run, then estimate and save."""
        run = self.run_ctx
        run.store.update_run(run.run_id, status="running", error=None)
        self.trials.restart_clock()
        # Leave nothing behind (issue 35): the run's contexts are deleted when it ends,
        # whatever its verdict, and when it fails; only a run interrupted or cut off by an
        # outage keeps them, for its resume (an unreachable server could not delete them).
        keep = False
        try:
            with open_progress(run.console, self.show_progress) as progress:
                if run.kind == "run":
                    await self._execute_trials(progress)
                else:
                    await self._execute_bootstrap_collection(progress)
            await self.trials.flush()
            t0 = time.monotonic()
            estimated = await asyncio.to_thread(estimate_run, run.store, run.run_id)
            # The audits from outside the plan asks for (plan.probes), where the mechanism
            # has them; a probe left out is said in the results, not silently missing.
            estimated = await self._audit_from_outside(estimated)
            run.store.add_usage(run.run_id, wall_time_s=time.monotonic() - t0)
            results = finish_run(run.store, run.run_id, estimated)
        except AuditError as exc:
            keep = isinstance(exc, TargetUnavailable)
            await self.trials.flush()
            run.store.update_run(run.run_id, status="failed", error=str(exc))
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            keep = True
            await asyncio.shield(self.trials.flush())
            run.store.update_run(run.run_id, status="interrupted")
            raise
        finally:
            if not keep:
                await self.contexts.delete_all()
                if self.contexts.undeleted:
                    run.console.print(
                        f"[yellow]the run's contexts {', '.join(self.contexts.undeleted)} "
                        "could not be deleted from the server[/yellow]"
                    )
        return results

    async def _prepare(self, contexts: Mapping[int, ContextRecord]) -> None:
        """Let the mechanism learn what it needs before the trials (recorded in the run)."""
        run = self.run_ctx
        design = await run.mechanism.prepare(
            run.target, run.design, run.plan, contexts, bootstrap=run.kind == "bootstrap"
        )
        if design is not run.design:
            run.design = design  # the contexts and the trials read it from the run
            run.store.update_run(run.run_id, design=design.to_json())

    async def _audit_from_outside(self, estimated: RunResult) -> RunResult:
        """The run's results with its audits from outside (probes.registry.PROBES), one
        after the other (each alone leaves the client and the server busy: measured no
        faster at once): those of ``plan.probes`` whose ingredients the mechanism supplies
        for the run's design, each one's wall seconds under ``probe_wall_time_s``;
        ``probes_left_out`` names those the plan left out. A probe of black-box releases
        only follows a black-box run of real queries."""
        run = self.run_ctx
        kit = run.mechanism.ingredients(run.design, run.plan)
        black_box = run.kind == "run" and run.plan.threat_model == "black-box"
        seconds: dict[str, float] = {}
        for name, probe in PROBES.items():
            if name not in run.plan.probes or (probe.black_box_only and not black_box):
                continue
            if not kit.supplies(probe.needs):
                continue
            t0 = time.monotonic()
            try:
                found = await probe.run(run.target, kit)
            except TargetRejected as exc:
                # A refusal ends the probe, not the run (issue 44): the trials' findings
                # stand, and the refusal is said (a run with one exits 1 unless it has a
                # finding: results.refused_trials).
                found = {"status": "refused", "message": f"{name}: {exc}"}
            if found is None:
                continue
            seconds[name] = round(time.monotonic() - t0, 3)
            estimated = estimated.updated(**{name: found})  # the ledger's typed field too
        left_out = [p for p in ALL_PROBES if p not in run.plan.probes]
        if left_out:
            estimated = estimated.updated(probes_left_out=left_out)
        return estimated.updated(probe_wall_time_s=seconds) if seconds else estimated

    async def _execute_trials(self, progress: ProgressSink) -> None:
        plan = self.run_ctx.plan
        white = plan.threat_model == "white-box"
        mech = self.run_ctx.mechanism
        per_context = mech.queries_per_context(plan)
        for k, eps in enumerate(plan.mechanism.epsilons):
            setting = plan.setting_key(eps)
            worlds = trial_worlds(plan.seed, k, plan.trials)
            if per_context is None or (k == 0 and mech.learns_from_contexts):
                # What the mechanism learns (ESA: e(y1), e(y0)) comes from the first pair;
                # further contexts of a world (slots) are identical, their trials use it too.
                await self._prepare(await self.contexts.pair(setting, eps))
            slots = context_slots(worlds, per_context)

            async def pick(
                index: int,
                world: int,
                spent: ContextRecord | None,
                setting: str = setting,
                eps: float = eps,
                slots: list[int] = slots,
            ) -> ContextRecord:
                if spent is not None:
                    return await self.contexts.replace(setting, eps, world, slots[index], spent)
                return await self.contexts.get(setting, eps, world, slots[index])

            await self.trials.run(
                setting,
                eps,
                worlds,
                pick,
                white=white,
                progress=progress,
                description=f"{setting} {plan.threat_model}",
            )

    async def _execute_bootstrap_collection(self, progress: ProgressSink) -> None:
        plan = self.run_ctx.plan
        epsilons = list(plan.mechanism.epsilons)
        per_eps: list[dict[int, ContextRecord]] = []
        for eps in epsilons:
            per_eps.append(await self.contexts.pair(plan.setting_key(eps), eps))
        await self._prepare(per_eps[0])
        per_context = self.run_ctx.mechanism.queries_per_context(plan)

        async def pick(index: int, world: int, spent: ContextRecord | None) -> ContextRecord:
            # Clean votes do not depend on epsilon, so pair j (indices 2j, 2j+1) goes to the
            # contexts of epsilon j mod K: the same clean rows serve every epsilon, and every
            # epsilon's noisy votes feed its own noise check (dpicl_audit.estimators.noise_check).
            # Where one context's budget holds fewer rows than that, they go on in the
            # epsilon's further identical contexts (slots), as a real-query run's trials do.
            j, k = index // 2, (index // 2) % len(epsilons)
            slot = 0 if per_context is None else (j // len(epsilons)) // per_context
            setting, eps = plan.setting_key(epsilons[k]), epsilons[k]
            if spent is not None:
                return await self.contexts.replace(setting, eps, world, slot, spent)
            return await self.contexts.get(setting, eps, world, slot)

        await self.trials.run(
            CLEAN_SETTING,
            None,
            clean_worlds(plan.bootstrap.n_llm),
            pick,
            white=True,
            need_clean=True,
            progress=progress,
            description=self.run_ctx.mechanism.clean_name,
        )
