"""What the auditor writes as JSON (the trial log's columns, results.json, the report's data):
a JSON object whose values are JSON values (pydantic's recursive ``JsonValue``: strings,
numbers, booleans, null, lists and objects of them), checked where it is built."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

__all__ = ["JsonMapping", "JsonObject", "JsonValue"]

#: A JSON object as the auditor builds it for writing.
JsonObject = dict[str, JsonValue]
#: A JSON object as the auditor reads it (a stored column, a server's answer), read-only.
JsonMapping = Mapping[str, JsonValue]
