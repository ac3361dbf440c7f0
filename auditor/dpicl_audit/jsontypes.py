"""What the auditor writes as JSON (the trial log's columns, results.json, the report's data):
a JSON object whose values are JSON values (pydantic's recursive ``JsonValue``: strings,
numbers, booleans, null, lists and objects of them), checked where it is built; and the
small readers that narrow a value read back (a stored column, a server's answer) to what
the reader expects: :func:`json_object` and :func:`json_list` (an empty one where a key holds
none), :func:`json_float` and :func:`json_int` (``float()``/``int()``, refusing a value that
is neither a number nor a string)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

__all__ = [
    "JsonMapping",
    "JsonObject",
    "JsonValue",
    "json_float",
    "json_int",
    "json_list",
    "json_object",
]

#: A JSON object as the auditor builds it for writing.
JsonObject = dict[str, JsonValue]
#: A JSON object as the auditor reads it (a stored column, a server's answer), read-only.
JsonMapping = Mapping[str, JsonValue]


def json_object(value: JsonValue) -> JsonMapping:
    """``value`` where it is a JSON object, else an empty one: a key of a stored record or of
    a server's answer that may be missing or null, read as the object it holds."""
    return value if isinstance(value, dict) else {}


def json_list(value: JsonValue) -> list[JsonValue]:
    """``value`` where it is a JSON list, else an empty one (a key that may be missing or
    null, read as the list it holds)."""
    return value if isinstance(value, list) else []


def json_float(value: JsonValue) -> float:
    """``float(value)`` for a number or a string, as the value was read before it was typed;
    :class:`TypeError` naming any other value (null, a list, an object)."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


def json_int(value: JsonValue) -> int:
    """``int(value)`` for a number or a string; :class:`TypeError` naming any other value."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected an integer, got {value!r}")
