"""What the auditor writes as JSON (the trial log's columns, results.json, the report's data):
a JSON object whose values are JSON values (pydantic's recursive ``JsonValue``: strings,
numbers, booleans, null, lists and objects of them), checked where it is built."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

__all__ = ["JsonMapping", "JsonObject", "JsonValue", "json_object"]

#: A JSON object as the auditor builds it for writing.
JsonObject = dict[str, JsonValue]
#: A JSON object as the auditor reads it (a stored column, a server's answer), read-only.
JsonMapping = Mapping[str, JsonValue]


def json_object(value: JsonValue | None) -> JsonMapping:
    """``value`` where it is a JSON object, else an empty one: a key of a stored record or of
    a server's answer that may be missing or null, read as the object it holds."""
    return value if isinstance(value, dict) else {}
