"""The ``run``/``bootstrap`` flags' help texts (with the plan's defaults) and value parsers."""

from __future__ import annotations

from typing import Any

import typer

from dpicl_audit.plan import AuditPlan

__all__ = ["help_text", "parse_floats", "parse_strings"]

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
    for part in path.split("."):
        node = node[part]
    if isinstance(node, list):
        node = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in node)
    return f"{text} (default: {node})"


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
