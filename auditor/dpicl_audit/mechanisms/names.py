"""The names of the audited mechanisms, known without importing their audits.

The plan (:mod:`dpicl_audit.plan`) validates ``mechanism.name`` against these, and the audits
import the plan, so this module imports nothing of the package: the built-in names are listed
here, the others read from the installed distributions' entry points (group
:data:`ENTRY_POINT_GROUP`; :mod:`.registry` loads them).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "check_mechanism_name",
    "external_entry_points",
    "load_external",
    "mechanism_names",
]

#: The entry point group a third-party audit registers under (``name = "module:INSTANCE"``).
ENTRY_POINT_GROUP = "dpicl_audit.mechanisms"
#: The mechanisms audited by this package (:mod:`.voting`, :mod:`.esa`, :mod:`.dps_mozo`).
BUILTIN: tuple[str, ...] = ("voting", "esa", "dps-mozo")


def external_entry_points() -> list[EntryPoint]:
    """The installed third-party audits' entry points (their names, before loading)."""
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def mechanism_names() -> tuple[str, ...]:
    """Every mechanism an audit can name: the built-in ones, then the registered ones."""
    extra = [ep.name for ep in external_entry_points() if ep.name not in BUILTIN]
    return BUILTIN + tuple(dict.fromkeys(extra))


def check_mechanism_name(name: str) -> str:
    """``name`` when an audit exists for it; ``ValueError`` naming it and the known ones."""
    known = mechanism_names()
    if name not in known:
        raise ValueError(f"no audit for mechanism {name!r}; known: {list(known)}")
    return name


def load_external(name: str) -> Any:
    """The object a third-party entry point called ``name`` loads; None when none is."""
    for ep in external_entry_points():
        if ep.name == name:
            return ep.load()
    return None
