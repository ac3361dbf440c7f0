"""The mechanism registry: every DP mechanism this server serves, by name.

The routes, the context pipeline and the request schema look a mechanism up here; nothing
above this module branches on a mechanism's name. The built-ins are ``voting``, ``esa``,
``dps-mozo`` and ``public`` (DPS-MOZO's derived contexts). More are discovered, once, at
import, through the Python entry points of group ``dpicl.mechanisms``: each entry point
loads a :class:`Mechanism` instance (or a subclass, which is instantiated). A package adds
one with, in its ``pyproject.toml``::

    [project.entry-points."dpicl.mechanisms"]
    laplace-voting = "laplace_voting.server:LAPLACE_VOTING"

An entry point that fails to load, loads something else, or reuses a taken name stops the
server at start with an error naming it: a mechanism that silently went missing would
leave its contexts unanswerable.

The protocol
------------

A mechanism is a subclass of :class:`dpicl.mechanisms.base.Mechanism` with:

* ``name``: its name, the ``name`` of its settings and of the stored record;
* ``task``: ``"classification"`` (answered by ``/v1/classify``, as a label) or
  ``"generation"`` (``/v1/generate``, as a text); the OpenAI-compatible routes follow;
* ``settings``: its schema fragment, a pydantic model with ``name: Literal[<name>]``: the
  ``mechanism`` of ``POST /v1/contexts`` is the union, discriminated on ``name``, of every
  registered mechanism's settings (:func:`settings_models`); None for a mechanism never
  created from a request. It has an ``epsilon`` (held to ``DPICL_MAX_EPSILON``) and, over
  partitions, a ``partitions`` (held to ``DPICL_MAX_PARTITIONS``);
* ``check(settings, new)``: cross-field checks of a new context (``new``: a
  :class:`~dpicl.mechanisms.base.NewContext`: its exemplar count, budget, whether the
  request named one, the server's limits; default: none);
* ``calibration``: its calibration model, the stored record typed (a pydantic model whose
  fields are the record's keys, in order); ``Mechanism[C]`` is generic in it. Every
  answer reads a context's calibration through ``calibration_of(context)``, which parses
  the record once per loaded context
  (:meth:`dpicl.store.records.StoredContext.record_as`), never the record by key;
* ``calibrate(settings, n_exemplars)``: the calibration, once, at creation; stored as
  ``record(calibration)`` (default: its ``model_dump()``);
* ``sampling(calibration)``: how its answers sample (temperature, a generation's
  ``max_tokens``), which the zero-shot baseline answers with (default: the calibration's
  ``temperature`` and ``max_tokens`` where it has them, else argmax);
* ``own_budget(calibration)``: the context's budget when the mechanism sets it itself
  (DPS-MOZO: epsilon over ``queries`` answers); default None: the request's ``budget``;
* ``cost(calibration)``: one answer's cost event (:class:`dpicl.privacy.ledger.Cost`), which
  the ledger composes without knowing the mechanism. A Gaussian event carries mu^2; a
  pure epsilon-DP event enters the same sum through
  :func:`dpicl.privacy.accounting.pure_dp_mu2` (conservative, exact for randomized
  response) and also gives ``pure_epsilon`` (basic composition bounds what is reported);
  a mechanism with its own accountant gives ``curve`` (epsilon of n answers)
  and ``own_budget``;
* ``async answer(context, query, how)``: the pipeline: charge first and refund on failure
  (:func:`dpicl.pipelines.engine_calls.paid_engine_call`), release, and return an
  :class:`~dpicl.mechanisms.base.Outcome` (the context after the charge, the text or
  label, the cost and :meth:`dpicl.privacy.ledger.Ledger.status`);
* ``debug_model`` and ``debug_view(outcome, whitebox)``: the model of the white-box
  fields ``/v1/debug/*`` adds at ``noisy`` or ``internal``, and the view of one answer as
  that model (default None: no private internals). A debug route's response is the
  answer's fields plus the debug models' fields of every mechanism of its task, flat
  (:func:`dpicl.api.routes.debug.debug_response`).
* ``routers()``: routes it adds to the API beyond answering, included by the app beside
  the contexts routes (:func:`routers`; DPS-MOZO: ``POST /v1/contexts/{id}/synthesize``;
  default none).
* ``calibration_report(options)``: what ``dpicl calibrate`` prints (default: the record
  :meth:`calibrate` stores for the settings validated from the command's options; DPS-MOZO
  reads a token count and a sampling rate instead of a context's queries and exemplars).

The partition-and-aggregate pieces (settings of T partitions, their checks, the records
that begin with the partition layout, the Gaussian calibration and cost) are
:mod:`dpicl.mechanisms.partitioned`; the voting pipeline's paid label scoring is
:func:`dpicl.mechanisms.voting.pipeline.paid_scores` and its white-box view
:mod:`dpicl.mechanisms.voting.view`. A variant of private voting with other noise
subclasses :class:`~dpicl.mechanisms.partitioned.PartitionedMechanism` with a calibration
of its own and replaces ``calibrate``, ``cost``, ``answer`` and ``debug_view``
(``examples/laplace_voting``: a Laplace ``scale``).
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from dpicl.errors import ConfigurationError, InvalidRequest
from dpicl.mechanisms.base import Mechanism
from dpicl.mechanisms.dps_mozo.mechanism import DPS_MOZO
from dpicl.mechanisms.dps_mozo.public import PUBLIC
from dpicl.mechanisms.esa.mechanism import ESA
from dpicl.mechanisms.voting.mechanism import VOTING
from dpicl.store.repository import StoredContext

__all__ = [
    "ENTRY_POINT_GROUP",
    "MECHANISMS",
    "Mechanism",
    "get_mechanism",
    "mechanism_of",
    "routers",
    "serving",
    "settings_models",
]

ENTRY_POINT_GROUP = "dpicl.mechanisms"
BUILT_IN: tuple[Mechanism[Any], ...] = (VOTING, ESA, DPS_MOZO, PUBLIC)

log = logging.getLogger("dpicl.mechanisms")


def _load(ep: EntryPoint) -> Mechanism[Any]:
    try:
        obj = ep.load()
    except Exception as exc:
        raise ConfigurationError(
            f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r} failed "
            f"to load: {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(obj, type) and issubclass(obj, Mechanism):
        obj = obj()
    if not isinstance(obj, Mechanism):
        raise ConfigurationError(
            f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r} loads "
            f"{type(obj).__name__}, not a dpicl.mechanisms.base.Mechanism"
        )
    return obj


def discover() -> dict[str, Mechanism[Any]]:
    """The built-ins, then every mechanism installed under :data:`ENTRY_POINT_GROUP`."""
    found: dict[str, Mechanism[Any]] = {m.name: m for m in BUILT_IN}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        mech = _load(ep)
        if mech.name in found:
            raise ConfigurationError(
                f"entry point {ep.name!r} = {ep.value!r} registers mechanism {mech.name!r}, "
                "a name already taken"
            )
        found[mech.name] = mech
        log.info("mechanism %r loaded from entry point %s", mech.name, ep.value)
    return found


#: Every mechanism this server serves, by name: built-ins first, in a fixed order.
MECHANISMS: dict[str, Mechanism[Any]] = discover()


def get_mechanism(name: str) -> Mechanism[Any]:
    """The mechanism called ``name``; a 4xx naming it when there is none."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise InvalidRequest(
            f"no mechanism {name!r} on this server; it serves "
            + ", ".join(repr(n) for n in MECHANISMS),
            param="mechanism.name",
        ) from None


def mechanism_of(context: StoredContext) -> Mechanism[Any]:
    """The mechanism a stored context uses (a 4xx naming it when it is not installed)."""
    name = context.mechanism_name
    if name not in MECHANISMS:
        raise InvalidRequest(
            f"context {context.id} uses mechanism {name!r}, which is not installed on this server",
            param="context_id",
        )
    return MECHANISMS[name]


def serving(task: str) -> list[str]:
    """The names of the mechanisms whose answers ``task`` routes serve, in registry order."""
    return [m.name for m in MECHANISMS.values() if m.task == task]


def settings_models() -> tuple[type[BaseModel], ...]:
    """The settings models ``POST /v1/contexts`` accepts, in registry order."""
    return tuple(m.settings for m in MECHANISMS.values() if m.settings is not None)


def routers() -> list[APIRouter]:
    """The routes the mechanisms add to the API, in registry order."""
    return [r for m in MECHANISMS.values() for r in m.routers()]
