"""The one list of mechanisms: the built-in settings models and those registered from outside.

The plan (:mod:`dpicl_audit.plan`) assembles its ``[mechanism]`` section from
:func:`settings_models` (a union discriminated on ``name``), and the registry
(:mod:`dpicl_audit.mechanisms.registry`) loads each model's audit
(``MechanismSettings.audit``). Every settings model is loaded by name, the built-in ones
(:data:`BUILTIN`) exactly as those registered from outside: this module imports none of
them, so it sits below the plan and the mechanisms' folders above it.

A package outside this one registers a mechanism as the built-in ones are listed: by its
settings model, an entry point of :data:`ENTRY_POINT_GROUP` named as the mechanism, in a
module that imports no more of ``dpicl_audit`` than :mod:`.settings` (and the built-in
settings models); the model's ``audit`` says where its audit is::

    [project.entry-points."dpicl_audit.mechanisms"]
    laplace-voting = "laplace_voting.audit_settings:LaplaceVotingSettings"
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import get_args

from dpicl_audit.catalog.settings import MechanismSettings
from dpicl_audit.errors import InvalidAuditInput

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "builtin_entry_points",
    "check_mechanism_name",
    "default_mechanism_name",
    "external_entry_points",
    "mechanism_names",
    "model_name",
    "settings_for",
    "settings_models",
]

#: The entry point group a third-party mechanism's settings model registers under
#: (``name = "module:Model"``).
ENTRY_POINT_GROUP = "dpicl_audit.mechanisms"
#: The mechanisms audited by this package, the plan's default first: each one's settings
#: model by name, as an entry point names it.
BUILTIN: dict[str, str] = {
    "voting": "dpicl_audit.mechanisms.voting.settings:VotingSettings",
    "esa": "dpicl_audit.mechanisms.esa.settings:EsaSettings",
    "dps-mozo": "dpicl_audit.mechanisms.dps_mozo.settings:MozoSettings",
}


def model_name(model: type[MechanismSettings]) -> str:
    """The one ``name`` a settings model takes (its ``Literal``)."""
    names = get_args(model.model_fields["name"].annotation)
    if len(names) != 1 or not isinstance(names[0], str):
        raise InvalidAuditInput(
            f"settings model {model.__qualname__} must declare name: Literal['<its name>']"
        )
    return names[0]


def builtin_entry_points() -> list[EntryPoint]:
    """The built-in mechanisms as entry points, loaded as those registered from outside."""
    return [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in BUILTIN.items()]


def default_mechanism_name() -> str:
    """The mechanism of a plan that names none (the first built-in; a stored plan of an
    older version that named none was run with it too)."""
    return next(iter(BUILTIN))


def external_entry_points() -> list[EntryPoint]:
    """The installed third-party mechanisms' entry points (their names, before loading)."""
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _load_settings(ep: EntryPoint, known: dict[str, type[MechanismSettings]]) -> None:
    if ep.name in known:
        raise InvalidAuditInput(
            f"entry point {ep.name!r} ({ep.value}) of {ENTRY_POINT_GROUP} names a "
            f"mechanism that is already audited; known: {sorted(known)}"
        )
    model = ep.load()
    if not (isinstance(model, type) and issubclass(model, MechanismSettings)):
        raise InvalidAuditInput(
            f"entry point {ep.name!r} ({ep.value}) loads {model!r}, not a MechanismSettings "
            "subclass"
        )
    if model_name(model) != ep.name:
        raise InvalidAuditInput(
            f"entry point {ep.name!r} ({ep.value}) loads the settings of "
            f"{model_name(model)!r}; the entry point's name must be the mechanism's"
        )
    known[ep.name] = model


@cache
def _models() -> dict[str, type[MechanismSettings]]:
    found: dict[str, type[MechanismSettings]] = {}
    for ep in builtin_entry_points() + external_entry_points():
        _load_settings(ep, found)
    return found


def settings_models() -> tuple[type[MechanismSettings], ...]:
    """Every mechanism's settings model: the built-in ones, then the registered ones."""
    return tuple(_models().values())


def mechanism_names() -> tuple[str, ...]:
    """Every mechanism an audit can name: the built-in ones, then the registered ones."""
    return tuple(_models())


def settings_for(name: str) -> type[MechanismSettings] | None:
    """The settings model of the mechanism called ``name``; None for an unknown name."""
    return _models().get(name)


def check_mechanism_name(name: object) -> None:
    """``ValueError`` naming ``name`` and the known ones when no audit exists for it."""
    if not isinstance(name, str) or name not in _models():
        raise ValueError(f"no audit for mechanism {name!r}; known: {list(mechanism_names())}")
