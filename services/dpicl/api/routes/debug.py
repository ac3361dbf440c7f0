"""White-box endpoints. Registered only when ``DPICL_WHITEBOX`` is ``noisy`` or ``internal``
(otherwise the paths do not exist and answer 404); always behind the admin token.

What each mechanism shows is its own ``debug_view``, a model of its own (its
``debug_model``, :mod:`dpicl.mechanisms.registry`). A route's response is the answer's
fields, ``whitebox``, then the fields of every registered mechanism of the route's task,
flat and in registry order (:func:`debug_response`): the JSON keeps the one flat shape it
has always had, a field another mechanism does not have being null, while this module knows
no mechanism's fields."""

from __future__ import annotations

from copy import copy
from typing import Any, Union

from fastapi import APIRouter
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from dpicl.domain import Task
from dpicl.errors import ConfigurationError, InvalidRequest
from dpicl.mechanisms.base import Outcome
from dpicl.mechanisms.registry import MECHANISMS, mechanism_of
from dpicl.serving.answers import classify_body, classify_outcome, generate_body, generate_outcome
from dpicl.web.deps import Admin, AdminCaller, Svc
from dpicl.web.schemas import (
    ANSWER_ERRORS,
    ClassifyRequest,
    ClassifyResponse,
    GenerateRequest,
    GenerateResponse,
)

WHITEBOX = Field(description="noisy or internal")


def _merged(owners: list[tuple[str, FieldInfo]], everyone: list[str]) -> Any:
    """One field of a task's debug response from the mechanisms that have it: as declared
    when every mechanism of the task declares it alike and required; otherwise null for
    the others (its type the union of theirs, or null), its description naming them."""
    infos = [info for _, info in owners]
    types = list(dict.fromkeys(info.annotation for info in infos))
    shared = [owner for owner, _ in owners] == everyone
    if shared and len(types) == 1 and all(info.is_required() for info in infos):
        return (types[0], copy(infos[0]))
    desc = infos[0].description
    if not shared:
        names = ", ".join(owner for owner, _ in owners)
        desc = f"{names}: {desc}" if desc else names
    optional: Any = Union[(*types, None)]  # a union of the types found, and None
    return (optional, Field(default=None, description=desc))


def debug_response(name: str, base: type[BaseModel], task: Task) -> type[BaseModel]:
    """The response model of ``task``'s debug route: ``base`` (the answer), ``whitebox`` and
    every field of the debug models of ``task``'s mechanisms (:func:`_merged`). A
    mechanism's field named like one of the answer's stops the server at start."""
    models = [(m.name, m.debug_model) for m in MECHANISMS.values() if m.task == task]
    declared = [(owner, model) for owner, model in models if model is not None]
    owners: dict[str, list[tuple[str, FieldInfo]]] = {}
    for owner, model in declared:
        for field, info in model.model_fields.items():
            if field in base.model_fields or field == "whitebox":
                raise ConfigurationError(
                    f"mechanism {owner!r}'s debug field {field!r} is a field of "
                    f"{base.__name__} (or whitebox)"
                )
            owners.setdefault(field, []).append((owner, info))
    everyone = [owner for owner, _ in declared]
    fields = {field: _merged(found, everyone) for field, found in owners.items()}
    response: type[BaseModel] = create_model(
        name, __base__=base, whitebox=(str, WHITEBOX), **fields
    )
    return response


DebugClassifyResponse = debug_response("DebugClassifyResponse", ClassifyResponse, "classification")
DebugGenerateResponse = debug_response("DebugGenerateResponse", GenerateResponse, "generation")

router = APIRouter(
    prefix="/v1/debug", tags=["debug"], dependencies=[Admin], responses=ANSWER_ERRORS
)


def _view(out: Outcome, whitebox: str) -> dict[str, object]:
    view = mechanism_of(out.context).debug_view(out, whitebox)
    if view is None:
        raise InvalidRequest(
            f"context {out.context.id} uses mechanism {out.context.mechanism_name!r}, "
            "which has no private internals",
            param="context_id",
        )
    return {"whitebox": whitebox, **view.model_dump()}


@router.post("/classify", response_model=DebugClassifyResponse)
async def debug_classify(req: ClassifyRequest, svc: Svc, caller: AdminCaller) -> BaseModel:
    """Private voting with its noisy votes (and, at internal, the clean votes); charged as usual."""
    out = await classify_outcome(req, svc, principal=caller)
    body = classify_body(out, svc.engine.name) | _view(out, svc.settings.whitebox)
    return DebugClassifyResponse.model_validate(body)


@router.post("/generate", response_model=DebugGenerateResponse)
async def debug_generate(req: GenerateRequest, svc: Svc, caller: AdminCaller) -> BaseModel:
    """ESA or DPS-MOZO generation with its noisy internals (more at internal); charged as usual."""
    internal = svc.settings.whitebox == "internal"
    out = await generate_outcome(req, svc, principal=caller, exact=internal)
    body = generate_body(out, svc.engine.name) | _view(out, svc.settings.whitebox)
    return DebugGenerateResponse.model_validate(body)
