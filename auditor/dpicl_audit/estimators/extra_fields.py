"""The whole response is an observation (issue 35, item 1): every field a client receives
besides the answer, tested for dependence on the neighbouring world given the answer.

A DP release may be post-processed freely, but a field computed from the private data before
the noise (an un-noised vote share, a clean count, a per-partition flag) is not a release of
the mechanism: it can tell the two neighbouring contexts apart whatever the answer says. So,
per field and per released answer, the field's values in world C1 and in world C0 must come
from one distribution:

* numeric fields: the two-sided Mann-Whitney U test (scipy.stats.mannwhitneyu, asymptotic
  with continuity correction where ties occur);
* other fields (text, true/false): the chi-square test of the world x value table
  (scipy.stats.chi2_contingency), or Fisher's exact test on a 2 x 2 table.

Per field, the answers' p-values (their trials are disjoint: independent tests) are combined
by Fisher's method (scipy.stats.combine_pvalues); an answer where the field has one value in
both worlds is no test. The smallest field's p-value, times the number of fields tested
(Bonferroni; a field with one value everywhere is not tested), is the test's p-value; below
:data:`ALPHA` (1e-4: a correct server is flagged in at most 1 run in 10,000) it is a
VIOLATION that names the field. Fields public by design are not tested here:
the cost and the budget (checked against their own prediction by the ledger probe; also
inside ``usage.dpicl``, which the surface probe checks against them), the ids
and timestamps of a response, and the answer itself (:data:`PUBLIC`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
from scipy import stats

from dpicl_audit.jsontypes import JsonMapping, JsonObject

__all__ = ["ALPHA", "PUBLIC", "Dependence", "dependence_test", "response_fields"]

#: Error of the test: a server whose fields are independent of the world is flagged in at
#: most this fraction of runs.
ALPHA = 1e-4
#: Fields (dotted paths, ``*`` for any list index) that are public by design or the answer.
PUBLIC = (
    "label",
    "text",
    "context_id",
    "engine",
    "cost",
    "budget",
    "id",
    "object",
    "created",
    "model",
    "system_fingerprint",
    "choices.*.index",
    "choices.*.message.content",
    "choices.*.message.role",
    "choices.*.text",
    "dpicl.cost",
    "dpicl.budget",
    "dpicl.engine",
    "dpicl.context_id",
    "dpicl.label",
    # The same cost and budget inside ``usage`` (named as the X-DPICL-* headers), where
    # clients that drop a top-level extension keep them; checked against the body's figures
    # by the surface probe (dpicl_audit.probes.surface.public_departures).
    "usage.dpicl",
)


class Dependence(TypedDict):
    """What :func:`dependence_test` found: the most dependent ``field`` (None where none could
    be tested) and the answer it depends most at, with its corrected ``p_value``."""

    status: Literal["ok", "violation"]
    fields: list[str]
    tests: int
    p_value: float | None
    field: str | None
    answer: NotRequired[str]
    message: str


#: At most this many fields are kept per response (a malformed answer must not flood the log).
_MAX_FIELDS = 64


@functools.cache  # every trial's response has the same few dozen paths
def _public(path: str) -> bool:
    parts = path.split(".")
    for pub in PUBLIC:
        want = pub.split(".")
        if len(parts) >= len(want) and all(
            w in ("*", p) for w, p in zip(want, parts, strict=False)
        ):
            return True
    return False


def _flatten(value: object, prefix: str, out: JsonObject) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}.{i}", out)
    elif value is None or isinstance(value, bool | int | float | str):
        out[prefix] = value


def response_fields(response: JsonMapping) -> JsonObject:
    """The fields of a response besides the answer and what is public by design, flattened
    to dotted paths (list indices as numbers); empty for a response that has none."""
    flat: JsonObject = {}
    _flatten(response, "", flat)
    kept = {k: v for k, v in flat.items() if not _public(k)}
    return dict(sorted(kept.items())[:_MAX_FIELDS])


def _numeric(values: Iterable[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _p_value(a: Sequence[Any], b: Sequence[Any]) -> float | None:
    """Two-sample p-value of one field's values in the two worlds (None: nothing to test)."""
    if len(a) < 2 or len(b) < 2:
        return None
    if _numeric([*a, *b]):
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if np.all(np.concatenate([x, y]) == x[0]):
            return 1.0
        return float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    levels = sorted({repr(v) for v in [*a, *b]})
    if len(levels) < 2:
        return 1.0
    if len(levels) > max(len(a), len(b)) // 2:
        return None  # (nearly) every value its own: an id, not a category
    table = np.array([[sum(repr(v) == lev for v in side) for lev in levels] for side in (a, b)])
    if table.shape == (2, 2):
        return float(stats.fisher_exact(table).pvalue)
    return float(stats.chi2_contingency(table).pvalue)


def dependence_test(
    rows: Sequence[tuple[int, str, JsonMapping]], alpha: float = ALPHA
) -> Dependence | None:
    """Test each field of ``rows`` (``(world, answer, fields)`` per trial) for dependence on
    the world given the answer (module docstring). None where no trial carried a field;
    else ``{"status", "fields", "tests", "p_value", "field", "message"}``, status
    ``violation`` when the Bonferroni-corrected p-value is below ``alpha``."""
    names = sorted({k for _, _, f in rows for k in f})
    if not names:
        return None
    best: tuple[float, str, str] | None = None
    tests = 0
    for name in names:
        found: list[tuple[float, str]] = []
        for answer in sorted({a for _, a, _ in rows}):
            side = {
                w: [f.get(name) for ww, a, f in rows if ww == w and a == answer and name in f]
                for w in (1, 0)
            }
            if len({repr(v) for v in [*side[1], *side[0]]}) < 2:
                continue  # one value in both worlds: no test
            p = _p_value(side[1], side[0])
            if p is not None:
                found.append((p, answer))
        if not found:
            continue
        # The answers' tests use disjoint trials: independent, combined by Fisher's method.
        tests += 1
        combined = (
            found[0][0]
            if len(found) == 1
            else float(stats.combine_pvalues([p for p, _ in found], method="fisher").pvalue)
        )
        if best is None or combined < best[0]:
            best = (combined, name, min(found)[1])
    if best is None or tests == 0:
        return {
            "status": "ok",
            "fields": names,
            "tests": 0,
            "p_value": None,
            "field": None,
            "message": f"fields {names} could not be tested (too few trials per answer)",
        }
    p = min(1.0, best[0] * tests)
    flagged = p < alpha
    shown = "0" if p == 0 else f"{p:.2g}" if math.isfinite(p) else str(p)
    message = (
        f"PRIVACY VIOLATION: the response field {best[1]!r} depends on the neighbouring "
        f"world given the released answer (most at {best[2]!r}; p = {shown} over {tests} "
        "fields, "
        f"below {alpha:g}): it releases the private data beside the DP answer"
        if flagged
        else f"no response field depends on the world given the answer (fields {names}; "
        f"smallest corrected p = {shown} over {tests} fields)"
    )
    return {
        "status": "violation" if flagged else "ok",
        "fields": names,
        "tests": tests,
        "p_value": p,
        "field": best[1],
        "answer": best[2],
        "message": message,
    }
