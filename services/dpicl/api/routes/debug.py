"""White-box endpoints. Registered only when ``DPICL_WHITEBOX`` is ``noisy`` or ``internal``
(otherwise the paths do not exist and answer 404); always behind the admin token."""

from __future__ import annotations

from fastapi import APIRouter

from dpicl.api.deps import Admin, AdminCaller, Svc
from dpicl.api.routes.inference import (
    ERRORS,
    classify_body,
    classify_outcome,
    generate_body,
    generate_outcome,
)
from dpicl.api.schemas import (
    ClassifyRequest,
    DebugClassifyResponse,
    DebugGenerateResponse,
    GenerateRequest,
)
from dpicl.errors import InvalidRequest
from dpicl.pipelines.esa import EsaOutcome
from dpicl.pipelines.mozo import MozoOutcome
from dpicl.privacy.ledger import guarantee_of

router = APIRouter(prefix="/v1/debug", tags=["debug"], dependencies=[Admin], responses=ERRORS)


@router.post("/classify", response_model=DebugClassifyResponse)
async def debug_classify(
    req: ClassifyRequest, svc: Svc, caller: AdminCaller
) -> DebugClassifyResponse:
    """Private voting with its noisy votes (and, at internal, the clean votes); charged as usual."""
    out = await classify_outcome(req, svc, principal=caller)
    labels = out.context.labels
    rel = out.release
    body = classify_body(out, svc.engine.name) | {
        "whitebox": svc.settings.whitebox,
        "sigma": out.sigma,
        "noisy_votes": {lab: float(v) for lab, v in zip(labels, rel.noisy_counts, strict=True)},
    }
    if svc.settings.whitebox == "internal":
        body["clean_votes"] = {lab: int(v) for lab, v in zip(labels, rel.clean_counts, strict=True)}
        # None: the partition abstained (unusable scores; mechanisms.voting.ABSTAIN).
        body["partition_votes"] = [
            labels[v] if v >= 0 else None for v in map(int, rel.partition_votes)
        ]
    return DebugClassifyResponse.model_validate(body)


@router.post("/generate", response_model=DebugGenerateResponse)
async def debug_generate(
    req: GenerateRequest, svc: Svc, caller: AdminCaller
) -> DebugGenerateResponse:
    """ESA or DPS-MOZO generation with its noisy internals (more at internal); charged as usual."""
    internal = svc.settings.whitebox == "internal"
    out = await generate_outcome(req, svc, principal=caller, exact=internal)
    if isinstance(out, MozoOutcome):
        return DebugGenerateResponse.model_validate(_mozo_body(out, svc.engine.name, internal))
    if not isinstance(out, EsaOutcome):
        raise InvalidRequest(
            f"context {out.context.id} uses mechanism {out.context.mechanism['name']!r}, "
            "which has no private internals",
            param="context_id",
        )
    rel = out.release
    body = generate_body(out, svc.engine.name) | {
        "whitebox": svc.settings.whitebox,
        "sigma": out.sigma,
        "noisy_mean": rel.noisy_mean.tolist(),
        "candidates": out.candidates,
        "distances": rel.distances.tolist(),
    }
    if svc.settings.whitebox == "internal":
        body["clean_mean"] = rel.clean_mean.tolist()
        body["partition_texts"] = out.partition_texts
        body["partition_embeddings"] = out.partition_embeddings.tolist()
    return DebugGenerateResponse.model_validate(body)


def _mozo_body(out: MozoOutcome, engine: str, internal: bool) -> dict[str, object]:
    m = out.context.mechanism
    proven = guarantee_of(m) == "proven"
    tokens: list[dict[str, object]] = []
    worst_div = 0.0
    worst_ratio = 0.0
    for t in out.tokens:
        tok: dict[str, object] = {
            "token_id": t.token_id,
            "top_ids": t.top_ids.tolist(),
            "lambdas": t.lambdas.tolist(),
            "log_ratios": t.log_ratios.tolist(),
            "divergences": None if t.divergences is None else t.divergences.tolist(),
        }
        if internal:
            tok["shots"] = t.shots.tolist()
            tok["mixed_probs"] = t.mixed_probs.tolist()
            tok["zero_shot_probs"] = t.zero_probs.tolist()
            tok["product_probs"] = t.product_probs.tolist()
            if t.exact is not None:
                tok["exact_divergences"] = t.exact.tolist()
                worst_div = max(worst_div, float(t.exact.max(initial=0.0)))
            if t.exact_log_ratios is not None:
                tok["exact_log_ratios"] = t.exact_log_ratios.tolist()
                worst_ratio = max(worst_ratio, float(t.exact_log_ratios.max(initial=0.0)))
        tokens.append(tok)
    body = generate_body(out, engine) | {
        "whitebox": "internal" if internal else "noisy",
        "guarantee": guarantee_of(m),
        "tokens": tokens,
    }
    if proven:
        eps0 = float(m["max_log_ratio"])
        body |= {
            "max_log_ratio": eps0,
            "per_token_epsilon": float(m["per_token_epsilon"]),
            "radius": eps0,
            "per_token_bound": float(m["per_token_epsilon"]),
        }
    else:
        alpha, beta = int(m["alpha"]), float(m["beta"])
        body |= {
            "alpha": alpha,
            "beta": beta,
            "radius": beta * alpha,
            "per_token_bound": 4.0 * beta * alpha,
        }
    if internal:
        body["max_exact_log_ratio"] = worst_ratio
        if not proven:
            body["max_exact_divergence"] = worst_div
    return body
