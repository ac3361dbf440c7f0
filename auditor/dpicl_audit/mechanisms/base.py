"""The protocol every audited mechanism implements, and the helpers they share.

A mechanism's package (:mod:`.voting`, :mod:`.esa`, :mod:`.dps_mozo`, or one outside this
package registered through an entry point: :mod:`.registry`) is the only place that knows,
for its mechanism:

1. how the neighbouring contexts are built (:meth:`MechanismAudit.build_design`,
   :meth:`~MechanismAudit.context_body`);
2. what the audit query is (stored in the design);
3. what an observation is and how it becomes a decision (black-box) or a score (white-box)
   (:meth:`~MechanismAudit.trial`);
4. the setting's claims, with the mechanism's exact epsilon for the design
   (:meth:`~MechanismAudit.setting_claims`, a :class:`~dpicl_audit.claims.SettingClaims`);
5. how a bootstrap simulates it, where one exists (:meth:`~MechanismAudit.estimate`).

**A subclass must provide** the class attributes ``name`` (the plan's and the server's
``mechanism.name``), ``settings`` (its settings model, :mod:`.settings`: the plan's
``[mechanism]`` section, the attacks it takes, its plan checks and report lines), ``task``
(``"classification"`` or ``"generation"``) and ``design_type`` (a frozen dataclass with
``to_json``/``from_json``, stored with the run), and the methods ``build_design``,
``summary``, ``context_body``, ``trial``, ``setting_claims`` and ``estimate``. It may override
``has_bootstrap``, ``learns_from_contexts``, ``calls_per_query``, ``queries_per_context``,
``check_context``, ``check_pair``, ``prepare``, ``upgrade_run``, ``ingredients`` (what the
probes from outside need of it: :mod:`dpicl_audit.probes`) and ``claims_per_setting``.
A variant of a built-in mechanism subclasses its audit and overrides what differs (the
Laplace-noise voting of ``examples/laplace_voting``: the exact epsilon).

**Results are typed** (:mod:`dpicl_audit.results`): :meth:`~MechanismAudit.estimate` returns
a :class:`~dpicl_audit.results.SettingResult` whose ``black_box``/``white_box`` are
:class:`~dpicl_audit.results.Estimate` values with their :class:`~dpicl_audit.verdicts.Verdict`;
the mechanism's own facts and figures (thresholds, held-out splits, the ROC, labels) go in
``extra`` (:meth:`~dpicl_audit.results.Record.of`, :meth:`~dpicl_audit.results.Record.updated`).
The helpers of :mod:`.trial_estimates` take and return these values. A mechanism registered
from outside may still return the setting as a mapping of its JSON (as before issue 28): the
pipeline reads it with :meth:`~dpicl_audit.results.SettingResult.from_json` at that edge
(:func:`dpicl_audit.pipeline.estimation.estimate_setting`).

The pipeline (:mod:`dpicl_audit.pipeline.contexts`, :mod:`dpicl_audit.pipeline.trials`,
:mod:`dpicl_audit.pipeline.estimation`, :mod:`dpicl_audit.pipeline.runner`) and the report
are generic over this class.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from dpicl_audit.catalog.settings import MechanismSettings, PartitionedSettings
from dpicl_audit.claims import SettingClaims
from dpicl_audit.client import AuditTarget, ContextBody, GenerationTarget
from dpicl_audit.context_info import ContextInfo
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.jsontypes import JsonMapping, JsonObject, JsonValue
from dpicl_audit.mechanisms.trial_estimates import (
    estimate_trials,
    figure_fields,
    with_verdict,
)
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import budget_limit
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.results import SettingResult
from dpicl_audit.store import ContextRecord, RunRecord, TrialRecord

__all__ = [
    "Design",
    "MechanismAudit",
    "TrialAt",
    "ask",
    "estimate_trials",
    "exemplar_dicts",
    "figure_fields",
    "needs_internal",
    "require_keys",
    "with_verdict",
]


class Design(Protocol):
    """A mechanism's neighbour pair and audit query, stored with the run as JSON."""

    @property
    def attack(self) -> str: ...

    @property
    def position(self) -> int: ...

    @property
    def query(self) -> str: ...

    def to_json(self) -> JsonObject: ...


@dataclass(frozen=True, slots=True)
class TrialAt:
    """Where one trial goes: its setting, epsilon, index, world, context and access."""

    setting: str
    epsilon: float | None
    index: int
    world: int
    context: ContextRecord
    white: bool
    need_clean: bool = False

    def record(
        self,
        query: str,
        observation: JsonMapping,
        decision: int,
        latency: float,
        score: float | None = None,
    ) -> TrialRecord:
        """The trial log's record of this trial."""
        return TrialRecord(
            setting=self.setting,
            trial_index=self.index,
            world=self.world,
            context_id=self.context.context_id,
            query=query,
            observation=observation,
            decision=decision,
            latency_s=latency,
            epsilon=self.epsilon,
            score=score,
        )


async def ask(
    target: AuditTarget, at: TrialAt, query: str, *, max_tokens: int | None = None
) -> tuple[JsonMapping, float]:
    """Send the audit query (the debug endpoint for white-box trials): (answer, latency).

    ``max_tokens`` given: a generation context (``/v1/generate``), else classification.
    """
    cid = at.context.context_id
    t0 = time.perf_counter()
    if max_tokens is None:
        out = await (target.debug_classify if at.white else target.classify)(cid, query)
    else:
        if not isinstance(target, GenerationTarget):
            raise TargetProtocolError("the target has no generate/debug_generate endpoints")
        send = target.debug_generate if at.white else target.generate
        out = await send(cid, query, max_tokens=max_tokens)
    return out, time.perf_counter() - t0


@dataclass(frozen=True, slots=True)
class SettingRows:
    """One epsilon setting's logged rows, and what its estimates are read with."""

    plan: AuditPlan
    design: Any
    #: The setting's index in ``plan.mechanism.epsilons``.
    k: int
    #: Its trials, or for a bootstrap its clean debug rows.
    rows: Sequence[TrialRecord]
    #: Its claims (:meth:`MechanismAudit.setting_claims`) with the run's family.
    claims: SettingClaims
    bootstrap: bool


class MechanismAudit:
    """How one mechanism is audited. Subclasses override what differs."""

    #: ``plan.mechanism.name`` and the server's ``mechanism.name``.
    name: ClassVar[str]
    #: the server context's task.
    task: ClassVar[str]
    #: whether :meth:`estimate` can simulate (bootstrap runs, Algorithm 1 of paper 000).
    has_bootstrap: ClassVar[bool] = True
    #: whether :meth:`prepare` learns from the server before the trials (ESA: e(y1), e(y0)):
    #: the pipeline then gives it the first epsilon's pair also where a world's trials are
    #: spread over several identical contexts (:meth:`queries_per_context`), and every
    #: context's trials use what it learnt.
    learns_from_contexts: ClassVar[bool] = False
    #: what the clean collection of a bootstrap run is called in progress lines.
    clean_name: ClassVar[str] = "clean rows"
    #: the design dataclass (stored with the run through ``to_json``/``from_json``).
    design_type: ClassVar[Any]
    #: its settings model (the plan's ``[mechanism]``; the attacks it takes: ``.attacks``).
    settings: ClassVar[type[MechanismSettings]]

    # ---------------------------------------------------------------- design

    def build_design(self, plan: AuditPlan, dataset: LabelledDataset) -> Design:
        raise NotImplementedError

    def load_design(self, data: JsonMapping) -> Design:
        """A design stored with a run."""
        design: Design = self.design_type.from_json(data)
        return design

    def summary(self, design: Any) -> JsonObject:
        """What the results and the report say about the design."""
        raise NotImplementedError

    def context_body(
        self, design: Any, plan: AuditPlan, epsilon: float, world: int, *, name: str
    ) -> ContextBody:
        """The ``POST /v1/contexts`` body of C1 (``world == 1``) or C0 at one epsilon."""
        raise NotImplementedError

    def calls_per_query(self, plan: AuditPlan) -> int:
        """LLM calls behind one audit query."""
        return PartitionedSettings.of(plan).partitions

    def queries_per_context(self, plan: AuditPlan) -> int | None:
        """How many queries one context answers (None: any number)."""
        return None

    def check_context(self, info: ContextInfo, design: Any, epsilon: float) -> None:
        """Refuse a context whose mechanism record does not match the audit."""
        mech = info.get("mechanism")
        if not isinstance(mech, Mapping):
            raise TargetProtocolError(f"context {info.get('id')} has no mechanism record")
        eps = mech.get("epsilon")
        if eps is not None and not math.isclose(float(eps), epsilon, rel_tol=1e-12):
            raise TargetProtocolError(
                f"context {info.get('id')} has epsilon {eps}, the audit asked for {epsilon}"
            )

    def check_pair(self, setting: str, c1: ContextRecord, c0: ContextRecord) -> None:
        """Refuse neighbours that do not share one mechanism."""

    # ---------------------------------------------------------------- trials

    async def prepare(
        self,
        target: AuditTarget,
        design: Any,
        plan: AuditPlan,
        contexts: Mapping[int, ContextRecord],
        *,
        bootstrap: bool,
    ) -> Any:
        """The design completed with what must be learnt from the server before the trials
        (ESA: the signal embeddings); the same design when nothing is."""
        return design

    async def trial(
        self, target: AuditTarget, design: Any, plan: AuditPlan, at: TrialAt
    ) -> TrialRecord:
        """One audit query and what it observed: decision (black-box), score (white-box)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- estimates

    def setting_claims(
        self,
        plan: AuditPlan,
        design: Any,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> SettingClaims:
        """What the setting at ``epsilon`` claims, beside its estimate: epsilon_theory,
        epsilon_exact, the noise, and the mechanism's own facts."""
        raise NotImplementedError

    def claims_from_json(self, data: Mapping[str, JsonValue]) -> SettingClaims:
        """A setting's claims from its stored keys (the report's curves re-estimate a stored
        run); a mechanism whose estimates read facts of its own reads them here."""
        return SettingClaims.from_json(data)

    def estimate(self, s: SettingRows) -> SettingResult:
        """One epsilon's estimates from its logged rows (clean rows for a bootstrap), with
        their verdicts (an audit registered from outside may return the JSON mapping)."""
        raise NotImplementedError

    def upgrade_run(self, run: RunRecord) -> RunRecord | None:
        """``run`` as the pipeline reads it where an older audit of this mechanism logged it
        in shapes of its own (DPS-MOZO's separate audit before issue 9); None otherwise."""
        return None

    # ---------------------------------------------------------------- probes

    def ingredients(self, design: Any, plan: AuditPlan) -> Ingredients:
        """What the probes from outside get of this mechanism for the run's design
        (:mod:`dpicl_audit.probes`): here its context bodies and nothing a probe asks of
        them, so that no probe runs; a mechanism supplies what its probes need."""

        def body(world: int, epsilon: float, name: str) -> ContextBody:
            return self.context_body(design, plan, epsilon, world, name=name)

        return Ingredients(
            task=self.task,
            name=f"dpicl-audit {plan.seed}",
            epsilons=tuple(float(e) for e in plan.mechanism.epsilons),
            limit=budget_limit(plan),
            body=body,
            hold=lambda body, epsilon, answers: None,
        )

    def claims_per_setting(self, design: Any, threat_models: Sequence[str]) -> int:
        """How many statistical tests one epsilon setting may state a VIOLATION or BUG
        from: one figure per threat model. A run's claims hold for all of its settings'
        tests together (estimators.family), so this sets the size of that family."""
        return len(threat_models)


# ==================================================================== shared helpers


def require_keys(out: JsonMapping, keys: Sequence[str], endpoint: str) -> None:
    """Refuse a debug answer without the fields this mechanism's white-box trial reads."""
    missing = [k for k in keys if k not in out]
    if missing:
        raise TargetProtocolError(f"{endpoint} answered without {', '.join(missing)}")


def needs_internal(endpoint: str, field: str) -> TargetProtocolError:
    """The error of a bootstrap whose debug answer lacks the clean internals."""
    return TargetProtocolError(
        f"{endpoint} returned no {field}: bootstrap auditing needs a server started with "
        "DPICL_WHITEBOX=internal"
    )


def exemplar_dicts(exemplars: Sequence[Example]) -> list[dict[str, str]]:
    """Exemplars as the API's ``{"input", "output"}`` objects."""
    return [{"input": e.input, "output": e.output} for e in exemplars]
