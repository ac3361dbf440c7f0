"""The record a server keeps of a context, as the auditor reads it (:class:`ContextInfo`):
what ``POST /v1/contexts`` and ``GET /v1/contexts/{id}`` answer (``ContextInfo`` in
``openapi/openapi.json``), or what a context hook returns (``client.context_hook``), with the
two keys the audit adds when it stores it (``audit_fingerprint``, ``audit_generation``); and
its ``mechanism`` sub-record (:class:`MechanismInfo`), whose keys depend on the mechanism
(the server's calibration: ``sigma`` and ``sensitivity`` for the Gaussian ones, ``alpha``,
``beta``, ``max_log_ratio``, ``per_token_epsilon`` for DPS-MOZO).

TypedDicts, not dataclasses: the record is stored in the trial log as the server wrote it,
keys the auditor does not know included, so a stored run reads back exactly.
:func:`context_info` checks the shape the audit relies on (a string ``id``; a ``mechanism``
object where there is one) where a server's answer or a stored row enters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Required, TypedDict, cast

from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.jsontypes import JsonObject

__all__ = ["ContextInfo", "MechanismInfo", "SpentInfo", "context_info"]


class MechanismInfo(TypedDict, total=False):
    """A context's mechanism as the server runs it (the body's settings and what the
    server derived from them); every key optional, since each mechanism reports its own."""

    name: str
    epsilon: float
    delta: float
    partitions: int
    partition_seed: int | None
    calibration: str
    # The Gaussian mechanisms' noise (voting, ESA); ESA's body names its sensitivity
    # ("tight", "original"), the server reports the number.
    sigma: float
    sensitivity: float | str | None
    epsilon_exact: float | None
    # DPS-MOZO (paper 004, Algorithm 1) and its calibration.
    guarantee: str
    queries: int
    max_tokens: int
    n_shots: int
    alpha: float
    beta: float | None
    max_log_ratio: float | None
    per_token_epsilon: float | None


class SpentInfo(TypedDict, total=False):
    """A context's ledger as the server reports it (``BudgetInfo`` in the OpenAPI document;
    an OpenAI-compatible deployment's ``dpicl`` extension, where it sends one)."""

    queries: int
    spent_epsilon: float
    delta: float
    remaining_epsilon: float | None
    remaining_queries: int | None


class ContextInfo(TypedDict, total=False):
    """A context as the server reports it (HTTP API v1) and the trial log stores it."""

    id: Required[str]
    name: str | None
    task: str
    labels: list[str]
    template: str
    n_exemplars: int
    mechanism: MechanismInfo
    budget: dict[str, float] | None
    spent: SpentInfo
    # A context a hook made on an OpenAI-compatible deployment: its model as
    # ``GET /v1/models/{id}`` answers it (client.openai).
    model: JsonObject
    # Added by the audit when it stores the record (pipeline.contexts).
    audit_fingerprint: str
    audit_generation: int


def context_info(raw: Mapping[str, object]) -> ContextInfo:
    """``raw`` (a server's answer, a hook's, a stored row) as a context record, after
    checking what the audit relies on: a string ``id`` and, where present, a ``mechanism``
    object (:class:`TargetProtocolError` naming the bad value otherwise)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str):
        raise TargetProtocolError(f"a context record needs a string 'id'; got {str(raw)[:200]!r}")
    mech = raw.get("mechanism")
    if mech is not None and not isinstance(mech, Mapping):
        raise TargetProtocolError(
            f"context {raw['id']}: 'mechanism' must be an object, got {mech!r}"
        )
    # The shape is checked above; the values are the server's, kept exactly as it sent them.
    return cast(ContextInfo, dict(raw))
