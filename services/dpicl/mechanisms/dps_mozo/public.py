"""The ``public`` mechanism: ordinary few-shot ICL over the DP outputs a DPS-MOZO synthesis
stored (paper 004, Algorithm 3, "+Off"). Serving them is post-processing of DP outputs, so
an answer costs nothing; such contexts are only ever derived (:mod:`.offline`), never
created from a request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import Float, Int
from dpicl.engines.base import Engine, Exemplar, GenerationParams
from dpicl.mechanisms.base import Answering, Mechanism, Outcome
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.privacy.randomness import entropy_seed
from dpicl.prompts import render
from dpicl.store.repository import StoredContext


class PublicSettings(BaseModel):
    """Ordinary few-shot ICL over public (e.g. DP-synthesised) exemplars: no privacy cost.

    Not accepted by ``POST /v1/contexts``: such contexts are only derived by
    ``POST /v1/contexts/{id}/synthesize`` (DPS-MOZO offline mode), so private exemplars can
    never be served without a DP mechanism by mistake.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["public"] = "public"
    max_tokens: Int = Field(default=48, ge=1, le=1024)
    temperature: Float = Field(default=0.0, ge=0.0, le=10.0)
    derived_from: str | None = None


#: The cost event of a public answer: nothing (a Gaussian event of mu^2 = 0).
FREE = Cost(epsilon=0.0, delta=0.0, epsilon_exact=0.0, mu2=0.0)


@dataclass(frozen=True, slots=True)
class PublicOutcome:
    context: StoredContext
    text: str
    cost: Cost
    budget: BudgetStatus
    finish_reason: Literal["stop", "length"] = "stop"
    completion_tokens: int = 0


async def run_public(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    ledger: Ledger,
    max_tokens: int | None = None,
) -> PublicOutcome:
    """Plain few-shot generation with every (public) exemplar in the prompt; costs nothing."""
    cal = context.record_as(PublicSettings)
    prompt = render(
        context.template,
        [Exemplar(input=i, output=o) for i, o in context.exemplars],
        query,
        task=context.task,
        cache_scope=context.id,
    )
    params = GenerationParams(
        max_tokens=max_tokens or cal.max_tokens,
        temperature=cal.temperature,
        seed=entropy_seed(),
    )
    cost = FREE
    charged, texts = await paid_engine_call(
        ledger, context, cost, engine.name, engine.generate([prompt], params)
    )
    return PublicOutcome(
        context=charged, text=texts[0], cost=cost, budget=Ledger.status(charged, cost)
    )


class Public(Mechanism[PublicSettings]):
    """Few-shot ICL with every (public) exemplar in the prompt."""

    name = "public"
    task = "generation"
    settings = None  # derived by a synthesis only
    # Nothing is calibrated: the record is the settings a synthesis stored.
    calibration = PublicSettings

    def calibrate(self, settings: Any, n_exemplars: int) -> PublicSettings:
        assert isinstance(settings, PublicSettings)
        return settings

    def cost(self, calibration: PublicSettings) -> Cost:
        return FREE

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        return await run_public(
            context,
            query,
            engine=how.runtime.engine,
            ledger=how.ledger,
            max_tokens=how.max_tokens,
        )


PUBLIC = Public()
