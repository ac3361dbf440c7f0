"""The zero-shot answer of a context (``POST /v1/zero-shot``, admin only): the query in the
context's template, with its labels, and no exemplar. It is what a utility audit compares a
private answer with (docs/utility.md).

No exemplar enters the prompt, so the answer is independent of the private data: it costs
no privacy and the ledger is not touched (the same public prompt ESA draws its candidates
from and DPS-MOZO mixes with). It needs no white-box level. It is the admin's: a key that
could ask it would have the model answer for free, outside every budget.
"""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from dpicl.engines.base import GenerationParams
from dpicl.errors import InvalidRequest
from dpicl.mechanisms.registry import mechanism_of
from dpicl.pipelines.partitions import check_query, zero_shot_prompt
from dpicl.pipelines.votes import CONTENT_FREE, content_free_calibrated, partition_votes
from dpicl.privacy.randomness import entropy_seed, secure_rng
from dpicl.web.deps import AdminCaller, load_context, services_of
from dpicl.web.schemas import ANSWER_ERRORS, GenerateRequest, ZeroShotResponse

router = APIRouter(prefix="/v1", tags=["inference"], responses=ANSWER_ERRORS)

#: Tokens of a zero-shot generation when neither the request nor the context names a count.
_DEFAULT_MAX_TOKENS = 48


@router.post("/zero-shot", response_model=ZeroShotResponse)
async def zero_shot(
    req: GenerateRequest, request: Request, caller: AdminCaller
) -> ZeroShotResponse:
    """The context's template answered with no exemplar; costs no privacy (admin only)."""
    svc = services_of(request)
    query = check_query(req.query, svc.settings.max_query_chars)
    ctx = await load_context(req.context_id, svc, caller)
    prompt = zero_shot_prompt(ctx, query)
    # The context's own sampling settings, so that the baseline differs from its private
    # answers only by the exemplars (and the noise); its mechanism says what they are.
    mechanism = mechanism_of(ctx)
    sampling = mechanism.sampling(mechanism.calibration_of(ctx))
    temperature = sampling.temperature
    if ctx.task == "classification":
        if req.max_tokens is not None:
            raise InvalidRequest(
                f"max_tokens applies to generation; context {ctx.id} is a classification "
                f"context (got max_tokens={req.max_tokens})",
                param="max_tokens",
            )
        if sampling.label_calibration == "content-free":
            # Calibrated as the context's partitions are: divided by the content-free
            # input's probabilities under the same (here: no) exemplars.
            free = zero_shot_prompt(ctx, CONTENT_FREE)
            both = np.asarray(await svc.engine.score_labels([prompt, free], ctx.labels))
            scores = content_free_calibrated(both[:1], both[1:])
        else:
            # "none", and "exemplars" (batch calibration by the partition's exemplars): with
            # no exemplar there is no batch to estimate a bias from, so the baseline is raw.
            scores = await svc.engine.score_labels([prompt], ctx.labels)
        # One "partition" holding no exemplar votes as a voting partition does (argmax at
        # temperature 0, ties at random; None where the scores were unusable).
        vote = int(partition_votes(scores, temperature, secure_rng())[0])
        label = ctx.labels[vote] if vote >= 0 else None
        return ZeroShotResponse(
            context_id=ctx.id, task=ctx.task, label=label, engine=svc.engine.name
        )
    tokens = req.max_tokens or sampling.max_tokens or _DEFAULT_MAX_TOKENS
    params = GenerationParams(max_tokens=tokens, temperature=temperature, seed=entropy_seed())
    texts = await svc.engine.generate([prompt], params)
    return ZeroShotResponse(context_id=ctx.id, task=ctx.task, text=texts[0], engine=svc.engine.name)
