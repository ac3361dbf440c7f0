"""The audited mechanisms: one module each, one :class:`~.base.MechanismAudit` protocol.

========  =====================  ==============================================
name      module                 what it releases
========  =====================  ==============================================
voting    :mod:`.voting`         a label: noisy argmax of T partition votes
esa       :mod:`.esa`            a text: zero-shot candidate nearest a noisy mean
dps-mozo  :mod:`.mozo`           a text: tokens from mixed one-shot products
========  =====================  ==============================================

:mod:`.neighbours` holds the replace-one helpers they share, :mod:`.base` the protocol and
the Gaussian-mechanism helpers voting and ESA share. To audit a new mechanism, write one
module with a :class:`~.base.MechanismAudit` subclass and add it to :data:`MECHANISMS`; the
attacks it takes are declared in :mod:`dpicl_audit.attacks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.mechanisms.base import Design, MechanismAudit
from dpicl_audit.mechanisms.esa import ESA
from dpicl_audit.mechanisms.mozo import MOZO
from dpicl_audit.mechanisms.voting import VOTING

__all__ = ["MECHANISMS", "Design", "MechanismAudit", "get_mechanism", "load_design"]

MECHANISMS: dict[str, MechanismAudit] = {m.name: m for m in (VOTING, ESA, MOZO)}


def get_mechanism(name: str) -> MechanismAudit:
    """The audit module of the mechanism called ``name`` (``plan.mechanism.name``)."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise InvalidAuditInput(
            f"no audit for mechanism {name!r}; known: {sorted(MECHANISMS)}"
        ) from None


def load_design(mechanism: str, data: Mapping[str, Any]) -> Design:
    """A design stored with a run, read back by its mechanism's module."""
    return get_mechanism(mechanism).load_design(data)
