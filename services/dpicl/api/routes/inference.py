from __future__ import annotations

from fastapi import APIRouter

from dpicl.api.deps import Caller, Services, Svc, User, load_context
from dpicl.api.schemas import (
    BudgetInfo,
    ClassifyRequest,
    ClassifyResponse,
    CostInfo,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
)
from dpicl.errors import InvalidRequest
from dpicl.metrics import record_release
from dpicl.pipelines.esa import EsaOutcome, run_esa
from dpicl.pipelines.mozo import MozoOutcome, TokenSink, run_mozo
from dpicl.pipelines.mozo_offline import PublicOutcome, run_public
from dpicl.pipelines.partitions import check_query
from dpicl.pipelines.voting import VotingOutcome, run_voting
from dpicl.privacy.randomness import secure_rng
from dpicl.store.keys import Principal
from dpicl.store.repository import StoredContext

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (401, 403, 404, 413, 422, 429, 503)
}

router = APIRouter(prefix="/v1", tags=["inference"], responses=ERRORS)


async def context_for(
    context_id: str, svc: Services, principal: Principal, mechanisms: tuple[str, ...], path: str
) -> StoredContext:
    ctx = await load_context(context_id, svc, principal, for_query=True)
    name = ctx.mechanism.get("name")
    if name not in mechanisms:
        raise InvalidRequest(
            f"context {ctx.id} uses mechanism {name!r}; {path} serves "
            + " or ".join(repr(m) for m in mechanisms)
            + " contexts",
            param="context_id",
        )
    return ctx


async def classify_outcome(
    req: ClassifyRequest, svc: Services, *, principal: Principal
) -> VotingOutcome:
    """Shared by the public and the debug route: one private-voting answer, within
    ``principal``'s scope, charged to the context and to ``principal``'s key."""
    query = check_query(req.query, svc.settings.max_query_chars)
    ctx = await context_for(req.context_id, svc, principal, ("voting",), "/v1/classify")
    ledger = svc.ledger.billed_to(principal)
    out = await run_voting(ctx, query, engine=svc.engine, ledger=ledger, rng=secure_rng())
    released(out)
    return out


def classify_body(out: VotingOutcome, engine: str) -> dict[str, object]:
    return {
        "context_id": out.context.id,
        "label": out.label,
        "engine": engine,
        "cost": CostInfo.of(out.cost),
        "budget": BudgetInfo.of(out.budget),
    }


@router.post("/classify", response_model=ClassifyResponse, dependencies=[User])
async def classify(req: ClassifyRequest, svc: Svc, caller: Caller) -> ClassifyResponse:
    """Classify a query with private voting; returns the label, its cost and the budget left."""
    out = await classify_outcome(req, svc, principal=caller)
    return ClassifyResponse.model_validate(classify_body(out, svc.engine.name))


GenerateOutcome = EsaOutcome | MozoOutcome | PublicOutcome


def released(out: VotingOutcome | GenerateOutcome) -> None:
    """Count an answer's cost in the privacy metrics (dpicl.metrics)."""
    record_release(
        out.context.id, out.cost.epsilon, out.budget.spent_epsilon, out.budget.remaining_epsilon
    )


async def generate_outcome(
    req: GenerateRequest,
    svc: Services,
    *,
    principal: Principal,
    exact: bool = False,
    sink: TokenSink | None = None,
) -> GenerateOutcome:
    """Shared by the public, the OpenAI-compatible and the debug route: one generation,
    dispatched on the mechanism, within ``principal``'s scope, charged to the context and to
    ``principal``'s key. ``sink``: DPS-MOZO streams its tokens to it as they are sampled
    (the other mechanisms release their one answer at the end)."""
    out = await _generate(req, svc, principal=principal, exact=exact, sink=sink)
    released(out)
    return out


async def _generate(
    req: GenerateRequest,
    svc: Services,
    *,
    principal: Principal,
    exact: bool,
    sink: TokenSink | None,
) -> GenerateOutcome:
    query = check_query(req.query, svc.settings.max_query_chars)
    ctx = await context_for(
        req.context_id, svc, principal, ("esa", "dps-mozo", "public"), "/v1/generate"
    )
    ledger = svc.ledger.billed_to(principal)
    name = ctx.mechanism["name"]
    if name == "dps-mozo":
        return await run_mozo(
            ctx,
            query,
            engine=svc.engine,
            ledger=ledger,
            rng=secure_rng(),
            max_tokens=req.max_tokens,
            exact=exact,
            sink=sink,
        )
    if name == "public":
        return await run_public(
            ctx, query, engine=svc.engine, ledger=ledger, max_tokens=req.max_tokens
        )
    return await run_esa(
        ctx,
        query,
        engine=svc.engine,
        embedder=await svc.get_embedder(),
        ledger=ledger,
        rng=secure_rng(),
        max_tokens=req.max_tokens,
    )


def generate_body(out: GenerateOutcome, engine: str) -> dict[str, object]:
    return {
        "context_id": out.context.id,
        "text": out.text,
        "engine": engine,
        "mechanism": str(out.context.mechanism["name"]),
        "cost": CostInfo.of(out.cost),
        "budget": BudgetInfo.of(out.budget),
    }


@router.post("/generate", response_model=GenerateResponse, dependencies=[User])
async def generate(req: GenerateRequest, svc: Svc, caller: Caller) -> GenerateResponse:
    """Generate text (ESA, DPS-MOZO or public few-shot); returns it, its cost and budget left."""
    out = await generate_outcome(req, svc, principal=caller)
    return GenerateResponse.model_validate(generate_body(out, svc.engine.name))
