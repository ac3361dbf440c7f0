"""The vocabulary of a context's request: the bounds of the privacy parameters, the text and
number types every request schema uses, an exemplar, a budget, the server's limits.

These types are validated on construction and make the request schemas (the context's own
body is :class:`dpicl.spec.ContextSpec`, each mechanism's settings live in its folder under
:mod:`dpicl.mechanisms`), so the OpenAPI document and the server agree by construction.
Every error names the offending value (pydantic reports its location as ``param``).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

Task = Literal["classification", "generation"]

DEFAULT_TEMPLATES: dict[str, str] = {
    "classification": (
        "Classify the input. Answer with exactly one of these labels: {labels}.\n\n"
        "{exemplars}\n\nInput: {query}\nLabel:"
    ),
    "generation": "Follow the examples.\n\n{exemplars}\n\nInput: {query}\nOutput:",
}


# Hard bounds of the privacy parameters. Every accounting computation (the PLD grid, the
# brentq conversions, the DPS-MOZO calibration) has bounded cost inside them, measured at
# the corners at 0.2 s or less; a deployment never needs values outside (an epsilon of 100
# per answer is no privacy at all). Below delta = 1e-12 dp-accounting's PLD, whose tail
# truncation is about 1e-15, no longer gives a finite epsilon_exact. The settings
# (DPICL_MAX_EPSILON, ...) may only tighten these.
EPSILON_MIN = 1e-3
EPSILON_MAX = 100.0
BUDGET_EPSILON_MAX = 1000.0
DELTA_MIN = 1e-12
DELTA_MAX = 0.5
MAX_TEXT_CHARS = 20_000
MAX_LABEL_CHARS = 200
MAX_LABELS = 1000
MAX_PARTITIONS = 10_000
MAX_EXEMPLARS = 10_000

MAX_SYNTHESIZE_INPUTS = 10_000
MAX_NAME_CHARS = 200  # the store's name column
#: A tenant's name: what an operator types, short enough for the store's tenant column.
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
Tenant = Annotated[
    str,
    Field(
        pattern=TENANT_PATTERN,
        description="1-64 characters: letters, digits and _ . : - (not first).",
    ),
]
#: Contexts per page of GET /v1/contexts: each costs its ledger's accounting (a DPS-MOZO
#: context's composed epsilon takes up to about 10 ms), so a page stays well under a second.
MAX_LIST_LIMIT = 200

# PostgreSQL refuses NUL in text; checked by the schema (pydantic-core, no Python per
# string), which also refuses lone UTF-16 surrogates (JSON's "\ud800") that no driver can
# encode as UTF-8.
NO_NUL = r"^[^\x00]*$"
#: Characters nobody sees: Unicode's Default_Ignorable_Code_Point set (zero-width spaces and
#: joiners, the word joiner, the BOM, soft hyphens, bidi controls, variation selectors,
#: Hangul fillers, tags). Spelled out rather than as \p{...}: the pattern must mean the same
#: to pydantic-core's Rust regex (which checks it) and to Python's re (the OpenAPI
#: document's fuzzers read it); a test holds it equal to Rust's property.
INVISIBLE = (
    r"\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    r"\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
#: One character a reader can see: not whitespace, not a control character (NUL is one),
#: not invisible. "\u200b\u2060\ufeff" is as blank as "   ".
VISIBLE = rf"[^\s\x00-\x1f\x7f-\x9f{INVISIBLE}]"
#: Not blank either (queries, public inputs, exemplars, labels): at least one visible
#: character.
NONBLANK_NO_NUL = rf"^[^\x00]*{VISIBLE}[^\x00]*$"

#: Every free text the server accepts.
Text = Annotated[str, Field(pattern=NO_NUL)]
#: Texts that mean nothing when blank: exemplars and labels (a label of spaces is not one a
#: reader can tell from another, and an exemplar of spaces demonstrates nothing), queries
#: and public inputs. Blank means no visible character (:data:`VISIBLE`).
NonBlankText = Annotated[str, Field(pattern=NONBLANK_NO_NUL)]

#: The invisible characters themselves (Python's re reads the class as Rust's does).
INVISIBLE_RE = re.compile(f"[{INVISIBLE}]")

_HAS_VISIBLE: TypeAdapter[str] = TypeAdapter(Annotated[str, Field(pattern=VISIBLE)])


def is_blank(text: str) -> bool:
    """Whether ``text`` has no visible character: what :data:`NonBlankText` refuses, by the
    same regex (pydantic searches a pattern), for checks outside a request schema."""
    try:
        _HAS_VISIBLE.validate_python(text)
    except ValidationError:
        return True
    return False


def _json_number(value: object) -> object:
    # Lax pydantic reads true as 1 and "4" as 4: "epsilon": true made a context of
    # epsilon 1. A JSON number is the only number (4.0 still counts as the integer 4).
    if isinstance(value, bool | str):
        raise PydanticCustomError("number_type", "Input should be a number")
    return value


# Numbers of the request schemas: JSON numbers only, never a boolean or a string. (The
# validator sits beside the bounds, not in a nested alias, where pydantic would write the
# bounds into the JSON schema as "ge" and "le" instead of "minimum" and "maximum".)
JsonNumber = BeforeValidator(_json_number)
Int = Annotated[int, JsonNumber]
OptionalInt = Annotated[int | None, JsonNumber]
Float = Annotated[float, JsonNumber]

Epsilon = Annotated[float, Field(ge=EPSILON_MIN, le=EPSILON_MAX, allow_inf_nan=False), JsonNumber]
BudgetEpsilon = Annotated[
    float, Field(ge=EPSILON_MIN, le=BUDGET_EPSILON_MAX, allow_inf_nan=False), JsonNumber
]
Delta = Annotated[float, Field(ge=DELTA_MIN, le=DELTA_MAX, allow_inf_nan=False), JsonNumber]


class Exemplar(BaseModel):
    """One private demonstration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Annotated[NonBlankText, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
    output: Annotated[NonBlankText, Field(min_length=1, max_length=MAX_TEXT_CHARS)]


class ContextLimits(Protocol):
    """The server's limits on a context (:class:`dpicl.config.Settings` satisfies it)."""

    max_exemplars: int
    max_labels: int
    max_partitions: int
    max_epsilon: float
    max_budget_epsilon: float
    allow_unbudgeted: bool


class BudgetSpec(BaseModel):
    """Total (epsilon, delta) a context may spend over all its answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: BudgetEpsilon
    delta: Delta
