"""The typed JSON object every result is (:class:`Record`): its typed fields read and written
by codecs, every other key kept as stored in ``extra``; and :func:`jsonable`, the non-finite
floats JSON lacks written as strings."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Self, TypeVar

import numpy as np

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject, JsonValue
from dpicl_audit.verdicts import Verdict

__all__ = [
    "COUNT",
    "MAPPING",
    "NUMBER",
    "SAME",
    "TEXT",
    "VERDICT",
    "Codec",
    "Record",
    "jsonable",
]

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def jsonable(value: Any) -> Any:
    """Replace non-finite floats (JSON has none) by strings, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    return value


def _number(value: Any) -> float | None:
    """A stored number: ints stay ints (the JSON keeps its type), strings name non-finite."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    raise InvalidAuditInput(f"expected a number, got {value!r}")


def _number_json(value: float | None) -> Any:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _count(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise InvalidAuditInput(f"expected a whole number, got {value!r}")


#: What a codec reads from a value of an older shape: the key stays as stored, in ``extra``.
_UNTYPED = object()

#: What a record's typed keys hold when merged with ``extra``: JSON (``to_json``) or the
#: Python values (``as_mapping``).
V = TypeVar("V")


def _text(value: Any) -> Any:
    """A name (an id, a kind): anything else is an older shape (the DPS-MOZO audit before
    issue 9 stored its mechanism as an object), kept as stored."""
    return value if value is None or isinstance(value, str) else _UNTYPED


def _same(value: Any) -> Any:
    return value


def _mapping(value: Any) -> JsonMapping | None:
    if value is None or isinstance(value, Mapping):
        return value
    raise InvalidAuditInput(f"expected an object, got {value!r}")


#: (read, write) of a typed key's stored value.
Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]
NUMBER: Codec = (_number, _number_json)
COUNT: Codec = (_count, _same)
TEXT: Codec = (_text, _same)
MAPPING: Codec = (_mapping, _same)
#: A key a subclass reads and writes itself (a nested record).
SAME: Codec = (_same, _same)
#: A verdict, the one :class:`~dpicl_audit.verdicts.Verdict` type, stored as its JSON object.
VERDICT: Codec = (
    lambda v: None if v is None else Verdict.from_dict(v),
    lambda v: None if v is None else v.to_dict(),
)


@dataclass(frozen=True)
class Record:
    """A typed JSON object: the fields named in ``CODECS`` (key: (read, write)), the rest
    in ``extra``; ``keys``: the stored keys in order (a typed field not among them is
    written only where it has a value)."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    keys: tuple[str, ...] = field(default=(), kw_only=True, compare=False, repr=False)

    CODECS: ClassVar[dict[str, Codec]] = {}

    @classmethod
    def _typed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The typed fields of ``data`` (subclasses add their nested records)."""
        read_ = {k: read(data[k]) for k, (read, _) in cls.CODECS.items() if k in data}
        return {k: v for k, v in read_.items() if v is not _UNTYPED}

    @classmethod
    def from_json(cls, data: JsonMapping) -> Self:
        """Read a stored object (:class:`InvalidAuditInput` naming a value of the wrong
        type)."""
        if not isinstance(data, Mapping):
            raise InvalidAuditInput(f"{cls.__name__}: expected an object, got {data!r}")
        known = {f.name for f in fields(cls)}
        typed = cls._typed(data)
        extra = {k: v for k, v in data.items() if k not in typed}  # the keys not typed
        return cls(**{k: v for k, v in typed.items() if k in known}, extra=extra, keys=tuple(data))

    @classmethod
    def _split(cls, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``values`` as (the typed fields, the rest)."""
        known = {f.name for f in fields(cls)} - {"extra", "keys"}
        typed = {k: v for k, v in values.items() if k in known}
        return typed, {k: v for k, v in values.items() if k not in known}

    @classmethod
    def _stored_keys(
        cls, keys: tuple[str, ...], values: Iterable[str], extra: Container[str]
    ) -> tuple[str, ...]:
        """``keys`` and, after them, the new keys of ``values`` that are stored under their
        own name (a typed key, or one kept in ``extra``): the order they are written in."""
        new = (k for k in values if k not in keys and (k in cls.CODECS or k in extra))
        return keys + tuple(new)

    @classmethod
    def of(cls, **values: Any) -> Self:
        """A record as a producer builds it: the typed fields by name (nested records and
        verdicts typed), every other key in ``extra``, in the order given; a typed field
        given as None is written as null, as an absent one is not."""
        typed, extra = cls._split(values)
        return cls(**typed, extra=extra, keys=cls._stored_keys((), values, extra))

    def updated(self, **values: Any) -> Self:
        """The record with ``values`` set: typed fields replaced, other keys in ``extra``
        (a key given anew is written after the others)."""
        typed, extra = self._split(values)
        keys = self._stored_keys(self.keys, values, extra)
        return replace(self, **typed, extra={**self.extra, **extra}, keys=keys)

    def get(self, key: str, default: Any = None) -> Any:
        """The value under a stored key: a typed field (None where unset) or ``extra``'s."""
        if key in self.extra:
            return self.extra[key]
        return getattr(self, key, default) if key in self.CODECS else default

    def _written(self) -> JsonObject:
        """Every typed field as stored (subclasses write their nested records)."""
        return {k: write(getattr(self, k, None)) for k, (_, write) in self.CODECS.items()}

    def _merged(self, typed: Mapping[str, V]) -> dict[str, V | JsonValue]:
        """``typed`` (a value per typed key) and ``extra``, keys in their stored order."""
        out: dict[str, V | JsonValue] = {}
        for k in self.keys:
            out[k] = self.extra[k] if k in self.extra else typed[k]
        for k, v in typed.items():
            if k not in out and v is not None:
                out[k] = v
        return out | {k: v for k, v in self.extra.items() if k not in out}

    def to_json(self) -> JsonObject:
        """The JSON object, as stored (exactly what :meth:`from_json` read)."""
        return self._merged(self._written())

    def as_mapping(self) -> dict[str, Any]:
        """The stored keys with their values as Python holds them (numbers as floats, a
        verdict as a :class:`~dpicl_audit.verdicts.Verdict`): what the estimators and the
        claims read (:func:`~dpicl_audit.verdicts.gaussian_verdict`); a nested record
        as its own mapping."""
        typed = {k: getattr(self, k, None) for k in self.CODECS}
        return self._merged(
            {k: v.as_mapping() if isinstance(v, Record) else v for k, v in typed.items()}
        )

    def stored(self) -> Self:
        """The record as the store will hold it and read it back: its JSON (non-finite
        floats as strings, numpy values as Python's, tuples as lists) read again."""
        return self.from_json(jsonable(self.to_json()))
