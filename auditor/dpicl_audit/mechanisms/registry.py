"""The one registry of mechanism audits: each settings model's audit
(:mod:`dpicl_audit.catalog.mechanisms`).

A third-party package adds a mechanism without touching this package: it ships a settings
model (a :class:`~dpicl_audit.catalog.settings.MechanismSettings` subclass, whose ``audit`` names a
:class:`~.base.MechanismAudit` instance) and declares the model in its ``pyproject.toml``::

    [project.entry-points."dpicl_audit.mechanisms"]
    laplace-voting = "laplace_voting.audit_settings:LaplaceVotingSettings"

The entry point's name must be the model's ``name`` (the plan's ``mechanism.name``), and
the audit's ``name`` the same (the server's ``mechanism.name``). What the audit must provide
is listed in :class:`~.base.MechanismAudit`'s docstring.
"""

from __future__ import annotations

from importlib import import_module

from dpicl_audit.catalog.mechanisms import model_name, settings_models
from dpicl_audit.catalog.settings import MechanismSettings
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping
from dpicl_audit.mechanisms.base import Design, MechanismAudit
from dpicl_audit.store import RunRecord

__all__ = ["MECHANISMS", "discover", "get_mechanism", "load_design", "upgraded_run"]


def _audit_of(model: type[MechanismSettings]) -> MechanismAudit:
    """The audit a settings model names (``"module:ATTRIBUTE"``), checked."""
    name, where = model_name(model), getattr(model, "audit", None)
    if not isinstance(where, str) or where.count(":") != 1:
        raise InvalidAuditInput(
            f"the settings of {name!r} ({model.__qualname__}) name no audit: set its class "
            "attribute audit = 'module:ATTRIBUTE'"
        )
    module, attribute = where.split(":")
    audit = getattr(import_module(module), attribute, None)
    if not isinstance(audit, MechanismAudit):
        raise InvalidAuditInput(
            f"the settings of {name!r} name {where}, which is {audit!r}, not a "
            "MechanismAudit instance"
        )
    if audit.name != name or getattr(audit, "settings", None) is not model:
        raise InvalidAuditInput(
            f"the settings of {name!r} name {where}, the audit of {audit.name!r} with settings "
            f"{getattr(audit, 'settings', None)!r}; the audit's name and settings must be "
            "the mechanism's"
        )
    return audit


def discover() -> dict[str, MechanismAudit]:
    """The audit of every mechanism (:func:`~dpicl_audit.catalog.mechanisms.
    settings_models`), by name."""
    return {model_name(model): _audit_of(model) for model in settings_models()}


MECHANISMS: dict[str, MechanismAudit] = discover()


def get_mechanism(name: str) -> MechanismAudit:
    """The audit of the mechanism called ``name`` (``plan.mechanism.name``)."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise InvalidAuditInput(
            f"no audit for mechanism {name!r}; known: {sorted(MECHANISMS)}"
        ) from None


def load_design(mechanism: str, data: JsonMapping) -> Design:
    """A design stored with a run, read back by its mechanism's audit."""
    return get_mechanism(mechanism).load_design(data)


def upgraded_run(run: RunRecord) -> RunRecord | None:
    """A run logged by an older audit of some mechanism, as the pipeline reads it
    (:meth:`~.base.MechanismAudit.upgrade_run`: it ran to the end or not at all, so its
    stored estimate is kept and it does not resume); None for a run of today's shape."""
    for audit in MECHANISMS.values():
        found = audit.upgrade_run(run)
        if found is not None:
            return found
    return None
