"""Refusals a probe meets, as observations (issue 44).

A server may refuse some of a probe's requests for a reason of its own: a rate limit (429,
``Retry-After``), a quality gate that refuses at random, an overloaded model. Such a refusal
is not the answer the probe asked for, but neither is it the end of the probe: it is
observed, as a refused trial is (:func:`dpicl_audit.estimators.channels.refusal_observation`),
and where the probe asks both worlds, whether a request was refused, and what its refusal
says, is tested for dependence on the world as the trials' refusals are
(:func:`~dpicl_audit.estimators.channels.refusal_test`). Dependent: a VIOLATION (the refusal
releases the private data). Not dependent: the probe's other findings stand, read on the
answered requests, and its section says ``refused`` where it has no finding, so that the
run exits 1 (it could not ask what it planned) as a run with refused trials does. An
exhausted budget before the planned count stays what each probe says it is (its budget is
planned: a refusal of it is a departure of the ledger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from dpicl_audit.client.http import error_from_response
from dpicl_audit.estimators.channels import (
    REFUSAL,
    RefusalTest,
    refusal_observation,
    refusal_test,
)
from dpicl_audit.jsontypes import JsonMapping, JsonObject

__all__ = ["REFUSAL_ALPHA", "Refused", "refused", "world_refusals"]

#: Error of a probe's refusal test (the rate of its other tests of the worlds: a server whose
#: refusals do not depend on the world is flagged by it in at most 1 run in 10,000).
REFUSAL_ALPHA = 1e-4


@dataclass(frozen=True, slots=True)
class Refused:
    """A 4xx answer to a probe's request, not an exhausted budget: its refusal observation
    (``{"refusal": {status, code, message, param, expected, path}}``)."""

    observation: JsonObject

    def __str__(self) -> str:
        ref = self.observation[REFUSAL]
        assert isinstance(ref, Mapping)
        return f"refused {ref.get('status')} {ref.get('code')}"


def refused(response: httpx.Response, path: str) -> Refused | str:
    """A 4xx ``response`` to ``path`` as a probe observes it: a :class:`Refused` for a
    reason of the server's own, or ``refused <status> budget_exhausted`` for an exhausted
    budget (the one refusal a probe's budget plans for, and so a departure where it comes
    before the planned count)."""
    observation = refusal_observation(error_from_response(response, path))
    ref = observation[REFUSAL]
    assert isinstance(ref, Mapping)
    if ref.get("expected"):
        return f"refused {ref.get('status')} {ref.get('code')}"
    return Refused(observation)


@dataclass(frozen=True, slots=True)
class _Asked:
    """One probe request as :func:`~dpicl_audit.estimators.channels.refusal_test` reads a
    trial (its ``TrialRecord`` protocol)."""

    world: int
    observation: JsonMapping = field(default_factory=dict)
    decision: int | None = None
    latency_s: float = 0.0


def world_refusals(
    asked: Sequence[tuple[int, Refused | None]], alpha: float = REFUSAL_ALPHA
) -> RefusalTest | None:
    """Whether the probe's refusals depend on the world: ``asked`` is every request that
    was answered (None) or refused (:class:`Refused`), with its world; None where none was
    refused."""
    rows = [_Asked(w, {} if r is None else r.observation) for w, r in asked]
    return refusal_test(rows, alpha)
