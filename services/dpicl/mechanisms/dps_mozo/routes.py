"""DPS-MOZO's route: ``POST /v1/contexts/{context_id}/synthesize``, the offline mode
(:func:`.offline.synthesize`), which the mechanism contributes to the API through the
registry (:meth:`~dpicl.mechanisms.base.Mechanism.routers`); the app includes it beside
the contexts routes, so the core routes know nothing of synthesis.

It uses the route kit below the mechanisms (:mod:`dpicl.web.deps`: the services and who a
token acts for; :mod:`dpicl.web.schemas`: the shared response shapes) and nothing above.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import (
    MAX_NAME_CHARS,
    MAX_SYNTHESIZE_INPUTS,
    MAX_TEXT_CHARS,
    NONBLANK_NO_NUL,
    Text,
)
from dpicl.errors import InvalidRequest
from dpicl.mechanisms.dps_mozo.offline import synthesize
from dpicl.mechanisms.dps_mozo.public import PUBLIC
from dpicl.metrics import record_release
from dpicl.privacy.ledger import Ledger
from dpicl.privacy.randomness import secure_rng
from dpicl.store.keys import ADMIN
from dpicl.web.deps import Admin, ContextIdPath, Svc, load_context
from dpicl.web.schemas import BudgetInfo, ContextInfo, CostInfo, ErrorResponse

#: nginx's "client closed request": the status a synthesis stopped by a disconnect is
#: logged with (nobody is left to read it).
CLIENT_CLOSED_REQUEST = 499


class SynthesizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: list[
        Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=NONBLANK_NO_NUL)]
    ] = Field(
        min_length=1,
        max_length=MAX_SYNTHESIZE_INPUTS,
        description="Public inputs; one query each; at most DPICL_MAX_SYNTHESIZE_INPUTS.",
    )
    name: Annotated[Text, Field(max_length=MAX_NAME_CHARS)] | None = None


class SynthesizeResponse(BaseModel):
    """The derived context; serving it costs no further privacy."""

    context: ContextInfo = Field(description="The new context (mechanism 'public').")
    derived_from: str
    privacy_cost: float = Field(description="Privacy cost of each answer of the new context: 0.")
    note: str
    source_cost: CostInfo = Field(description="What each synthesised output cost the source.")
    source_budget: BudgetInfo = Field(description="The source context's budget after synthesis.")


# The contexts routes' prefix, tag and 401 (the route is documented among them).
router = APIRouter(
    prefix="/v1/contexts",
    tags=["contexts"],
    responses={401: {"model": ErrorResponse}},
)


def _check_inputs(req: SynthesizeRequest, most: int, limit: int) -> None:
    """The server's limits on a synthesis (the schema holds the hard ones)."""
    if len(req.inputs) > most:
        raise InvalidRequest(
            f"inputs has {len(req.inputs)} items; this server runs at most {most} per "
            "request (DPICL_MAX_SYNTHESIZE_INPUTS): send them in several requests",
            param="inputs",
        )
    for i, text in enumerate(req.inputs):
        # Blank inputs are refused by the schema (NonBlankText), like blank queries.
        if len(text) > limit:
            raise InvalidRequest(
                f"input {i} has {len(text)} characters; the limit is {limit} "
                "(DPICL_MAX_QUERY_CHARS)",
                param=f"inputs.{i}",
            )


@router.post(
    "/{context_id}/synthesize",
    response_model=SynthesizeResponse,
    status_code=status.HTTP_201_CREATED,
    responses={402: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
    dependencies=[Admin],
)
async def synthesize_context(
    context_id: ContextIdPath, req: SynthesizeRequest, svc: Svc, request: Request
) -> SynthesizeResponse | Response:
    """DPS-MOZO offline mode: DP outputs for public inputs, stored as a free-to-serve context."""
    _check_inputs(req, svc.settings.max_synthesize_inputs, svc.settings.max_query_chars)
    ctx = await load_context(context_id, svc, ADMIN)
    out = await synthesize(
        ctx,
        req.inputs,
        engine=svc.engine,
        ledger=svc.ledger.billed_to(ADMIN),
        repo=svc.repo,
        rng=secure_rng(),
        name=req.name,
        # Nothing cancels a request whose client left: asked between inputs, so the
        # inputs nobody waits for are neither run nor charged.
        stop=request.is_disconnected,
    )
    # Each output was charged as one query of the source context.
    spent, left = out.budget.spent_epsilon, out.budget.remaining_epsilon
    record_release(out.source.id, out.cost.epsilon * len(out.outputs), spent, left)
    derived = out.derived
    if not out.complete or derived is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return SynthesizeResponse(
        # The derived context is served by the ``public`` mechanism, at its (zero) cost.
        context=ContextInfo.of(derived, Ledger.status(derived, PUBLIC.cost_of(derived))),
        derived_from=out.source.id,
        privacy_cost=0.0,
        note=(
            f"{len(out.outputs)} outputs were generated with DPS-MOZO, each charged one query "
            f"of {out.source.id}; serving {derived.id} by few-shot ICL costs no further privacy"
        ),
        source_cost=CostInfo.of(out.cost),
        source_budget=BudgetInfo.of(out.budget),
    )
