"""The one registry of mechanism audits: the built-in ones and those found through entry points.

A third-party package adds a mechanism without touching this package: it ships a
:class:`~.base.MechanismAudit` instance and declares it in its ``pyproject.toml``::

    [project.entry-points."dpicl_audit.mechanisms"]
    laplace-voting = "laplace_voting.audit:LAPLACE_VOTING"

The entry point's name must be the instance's ``name`` (the plan's ``mechanism.name`` and the
server's ``mechanism.name``). What the subclass must provide is listed in
:class:`~.base.MechanismAudit`'s docstring; the attacks it takes in its ``attacks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.mechanisms.base import Design, MechanismAudit
from dpicl_audit.mechanisms.dps_mozo.audit import MOZO
from dpicl_audit.mechanisms.esa.audit import ESA
from dpicl_audit.mechanisms.names import ENTRY_POINT_GROUP, external_entry_points
from dpicl_audit.mechanisms.voting.audit import VOTING

__all__ = ["MECHANISMS", "discover", "get_mechanism", "load_design"]


def discover() -> dict[str, MechanismAudit]:
    """The built-in audits and every installed entry point of :data:`ENTRY_POINT_GROUP`."""
    found: dict[str, MechanismAudit] = {m.name: m for m in (VOTING, ESA, MOZO)}
    for ep in external_entry_points():
        if ep.name in found:
            raise InvalidAuditInput(
                f"entry point {ep.name!r} ({ep.value}) of {ENTRY_POINT_GROUP} names a "
                f"mechanism that is already audited; known: {sorted(found)}"
            )
        audit = ep.load()
        if not isinstance(audit, MechanismAudit):
            raise InvalidAuditInput(
                f"entry point {ep.name!r} ({ep.value}) loads {audit!r}, not a MechanismAudit "
                "instance"
            )
        if audit.name != ep.name:
            raise InvalidAuditInput(
                f"entry point {ep.name!r} ({ep.value}) loads the audit of {audit.name!r}; the "
                "entry point's name must be the mechanism's"
            )
        found[ep.name] = audit
    return found


MECHANISMS: dict[str, MechanismAudit] = discover()


def get_mechanism(name: str) -> MechanismAudit:
    """The audit of the mechanism called ``name`` (``plan.mechanism.name``)."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise InvalidAuditInput(
            f"no audit for mechanism {name!r}; known: {sorted(MECHANISMS)}"
        ) from None


def load_design(mechanism: str, data: Mapping[str, Any]) -> Design:
    """A design stored with a run, read back by its mechanism's audit."""
    return get_mechanism(mechanism).load_design(data)
