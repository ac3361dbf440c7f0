"""What counts as blank: no visible character. The invisible set is spelled out (so that
Python's re reads the pattern too) and must stay Unicode's Default_Ignorable_Code_Point, as
pydantic-core's Rust regex knows it."""

from __future__ import annotations

import re
from typing import Annotated

import pytest
from pydantic import Field, TypeAdapter, ValidationError

from dpicl.domain import INVISIBLE, NONBLANK_NO_NUL, is_blank
from dpicl.errors import InvalidRequest
from dpicl.pipelines.partitions import check_query


def _all_chars(pattern: str) -> str:
    """Every code point (surrogates aside) that the one-character ``pattern`` matches."""
    one = re.compile(pattern)
    return "".join(
        chr(cp) for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and one.match(chr(cp))
    )


def test_invisible_is_default_ignorable() -> None:
    ignorable = _all_chars(f"[{INVISIBLE}]")
    others = _all_chars(f"[^{INVISIBLE}]")
    TypeAdapter(
        Annotated[str, Field(pattern=r"^\p{Default_Ignorable_Code_Point}*$")]
    ).validate_python(ignorable)
    TypeAdapter(
        Annotated[str, Field(pattern=r"^\P{Default_Ignorable_Code_Point}*$")]
    ).validate_python(others)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "\u200b\u200c\u2060\ufeff",
        " \t\u3000\u200d\n",
        "\u00ad\u034f",
        "\x01\x7f",
        "\U000e0041",
    ],
)
def test_blank(text: str) -> None:
    assert is_blank(text)
    assert re.fullmatch(NONBLANK_NO_NUL, text) is None
    with pytest.raises(ValidationError):
        TypeAdapter(Annotated[str, Field(pattern=NONBLANK_NO_NUL)]).validate_python(text)
    with pytest.raises(InvalidRequest) as err:
        check_query(text, 100)
    assert err.value.param == "query"


@pytest.mark.parametrize("text", ["a", "\u200ba\u200b", " Yes ", "\u00e9", "\U0001f600", "\u0e01"])
def test_visible(text: str) -> None:
    assert not is_blank(text)
    TypeAdapter(Annotated[str, Field(pattern=NONBLANK_NO_NUL)]).validate_python(text)
    # Python's re reads the same pattern the same way (the OpenAPI document's fuzzers).
    assert re.fullmatch(NONBLANK_NO_NUL, text)
    assert check_query(text, 100) == text
