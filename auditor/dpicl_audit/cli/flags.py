"""The ``run``/``bootstrap`` flags: :class:`Flag` (an option and the plan path it
overrides), their help texts (with the plan's defaults) and value parsers."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from copy import copy
from dataclasses import dataclass
from typing import Annotated, Any, get_args

import typer
from typer.models import OptionInfo

from dpicl_audit.catalog.mechanisms import settings_models
from dpicl_audit.plan import AuditPlan

__all__ = [
    "BOTH",
    "Flag",
    "help_text",
    "own_flag",
    "parse_floats",
    "parse_strings",
    "plan_flag",
    "shared_flag",
]

_DEFAULTS = AuditPlan().model_dump(mode="json")
#: Defaults that depend on the mechanism (the plan fills them in).
_PER_MECHANISM = {
    "dataset": "news-mini (esa, dps-mozo: dialogsum-mini)",
    "mechanism.max_tokens": "64 (dps-mozo: 2)",
    "mechanism.n_shots": "|D| (mechanism.exemplars)",
    "mechanism.alpha": "the server's",
    "neighbour.position": "drawn from the seed",
    "neighbour.partition_seed": "drawn from the seed",
}


def help_text(path: str, text: str) -> str:
    """Help text with the plan's default for the dotted ``path``."""
    if path in _PER_MECHANISM:
        return f"{text} (default: {_PER_MECHANISM[path]})"
    node: Any = _DEFAULTS
    section, _, field = path.partition(".")
    if section == "mechanism" and field not in node[section]:
        # A field of another mechanism's settings than the default one's: its default there.
        node = _mechanism_default(field)
    else:
        node = node[section]
        if field:
            node = node[field]
    if isinstance(node, list):
        node = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in node)
    return f"{text} (default: {node})"


def _mechanism_default(field: str) -> object:
    """The default of ``field`` in the settings of the mechanisms that have it (one value:
    ``_PER_MECHANISM`` spells out those that differ)."""
    values = {
        json.dumps(model.model_fields[field].default)
        for model in settings_models()
        if field in model.model_fields
    }
    if len(values) != 1:
        raise KeyError(f"mechanism.{field}: defaults differ per mechanism: {sorted(values)}")
    return json.loads(values.pop())


def parse_floats(text: str | None, name: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise typer.BadParameter(f"{name} must be comma-separated numbers, got {text!r}") from exc


def parse_strings(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_probes(text: str | None) -> list[str] | None:
    """``--probes``: names, comma-separated (the plan checks them), or ``none``."""
    names = parse_strings(text)
    return [] if names == ["none"] else names


#: Commands that show a flag; the others hide it (``--trials-from`` is ``run``'s only).
BOTH = ("run", "bootstrap")


@dataclass(frozen=True)
class Flag:
    """One option: the function parameter typer reads, and the plan path it overrides."""

    name: str
    type: Any
    option: OptionInfo
    path: str | None = None  # None: the command reads it (not part of the plan)
    parse: Callable[[Any], Any] | None = None
    default: Any = None
    shown_in: tuple[str, ...] = BOTH

    def parameter(self, kind: str, panel: str) -> inspect.Parameter:
        info = copy(self.option)  # shared options (common.py) keep their own panel-less one
        info.rich_help_panel = panel
        info.hidden = info.hidden or kind not in self.shown_in
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=self.default,
            annotation=Annotated[self.type, info],
        )


def shared_flag(name: str, alias: Any, path: str | None = None, default: Any = None) -> Flag:
    """A flag from an option that other commands share (``UrlOpt``, ``DbOpt``: common.py)."""
    typ, info = get_args(alias)
    return Flag(name, typ, info, path, default=default)


def plan_flag(name: str, typ: Any, path: str | None, help: str, **kw: Any) -> Flag:
    """A flag whose help shows the plan's default for ``path`` (flags.help_text)."""
    shown_in = kw.pop("shown_in", BOTH)
    parse = kw.pop("parse", None)
    return Flag(
        name,
        typ,
        typer.Option(help=help_text(path, help) if path else help, **kw),
        path,
        parse,
        shown_in=shown_in,
    )


def own_flag(name: str, typ: Any, path: str, help: str, **kw: Any) -> Flag:
    """A flag with its own help text (no default in the plan to show)."""
    shown_in = kw.pop("shown_in", BOTH)
    parse = kw.pop("parse", None)
    return Flag(name, typ, typer.Option(help=help, **kw), path, parse, shown_in=shown_in)
