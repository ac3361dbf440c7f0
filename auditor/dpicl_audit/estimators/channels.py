"""Refusals and response time as observations (issue 44, items 1 and 2).

A trial's response is more than its answer. Two channels every trial has:

* **Refusals.** A 4xx answer to an audit query is logged as the trial's observation
  (``observation["refusal"]``: status, error code, message, param, and whether it is the
  expected kind, an exhausted budget: :func:`refusal_observation`), not raised. After the
  trials, per setting, whether a trial was refused is tested for dependence on the world
  (Fisher's exact test on the world x refused table, two-sided), and among refused trials
  their status, code and message (:func:`~dpicl_audit.estimators.extra_fields.
  dependence_test`); the smaller p-value, doubled (Bonferroni over the two), is the test's.
  A dependent refusal is a VIOLATION naming it: whether a query is answered releases the
  private data beside the DP answer. Refusals that do not depend on the world are named in
  the results (``refusals.status == "refused"``): the run's figures then read only the
  answered trials and the run exits with an error (1), as an audit that could not ask what
  it planned.
* **Timing.** Each trial's wall time (``latency_s``: the request, as the client saw it) is
  tested for dependence on the world *given the released answer* (each answer, a refusal's
  code included, is a stratum: an answer's own length may legitimately take time). The
  worlds' contexts differ in one exemplar, so an honest engine's time may differ a little
  between them (a longer prompt); only a difference beyond what that explains is a finding.
  The null tested is therefore "neither world's time exceeds :data:`TIME_RATIO` times the
  other's" (in the stochastic order: ``X1 <= R X0`` and ``X0 <= R X1``), with a one-sided
  Mann-Whitney test of ``log X1 - log R`` against ``log X0`` per stratum (and the mirror
  one), the strata combined by Fisher's method (disjoint trials: independent), doubled for
  the two directions. Under that null each stratum's p-value is super-uniform, so the
  test's false-alarm rate is at most its ``alpha`` for every server whose worlds' times stay
  within the factor, however noisy the network (noise added to both worlds alike only
  lowers the power). The finding names the median time in each world and their ratio.

Both tests of every setting share :data:`ALPHA` (1e-4 per run; :func:`channel_alpha`
divides it over the settings and the two channels), the rate of the response-field test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypedDict

import numpy as np
from scipy import stats

from dpicl_audit.errors import TargetRejected
from dpicl_audit.estimators.extra_fields import dependence_test
from dpicl_audit.jsontypes import JsonMapping, JsonObject, json_object

__all__ = [
    "ALPHA",
    "REFUSAL",
    "TIME_RATIO",
    "RefusalTest",
    "TimingTest",
    "channel_alpha",
    "is_refusal",
    "refusal_observation",
    "refusal_test",
    "times_test",
    "timing_test",
]

#: The error of a run's channel tests together (refusals and timing of every setting): a
#: server whose refusals and times do not depend on the world (beyond :data:`TIME_RATIO`)
#: is flagged in at most this fraction of runs.
ALPHA = 1e-4
#: The key of a refused trial's observation.
REFUSAL = "refusal"
#: How much slower one world's answers may be than the other's before it is a finding: the
#: null of the timing test. An honest engine's time grows with its prompt, and the worlds'
#: prompts differ in one exemplar of ``T x shots`` (at most one partition's prompt): the
#: bundled model on CPU measured a median ratio of 1.02 between the worlds, the oracle
#: 0.83-1.24 (noise: p = 1). A leak adds its own time to one world, and a loaded machine or
#: network adds the same time to both, which shrinks the ratio a leak shows: 50 ms more in
#: one world measured 1.4-1.7 times on a loaded 2-core machine (issue 44's server: 20 times).
#: 1.25 keeps that within reach and a prompt's length far inside.
TIME_RATIO = 1.25
#: Refusals of this error code are the expected kind: the context's budget is spent.
EXPECTED_CODES = ("budget_exhausted",)


class TrialRecord(Protocol):
    """What the tests read of a logged trial (:class:`dpicl_audit.store.TrialRecord`)."""

    @property
    def world(self) -> int: ...

    @property
    def observation(self) -> JsonMapping: ...

    @property
    def decision(self) -> int | None: ...

    @property
    def latency_s(self) -> float: ...


def channel_alpha(settings: int) -> float:
    """Each test's share of :data:`ALPHA`: two channels per setting (Bonferroni)."""
    return ALPHA / (2 * max(1, settings))


def refusal_observation(exc: TargetRejected) -> JsonObject:
    """What a refused trial logs: the response's status, code, message and param, and
    ``expected`` (an exhausted budget, the one refusal an audit plans for)."""
    return {
        REFUSAL: {
            "status": int(exc.status),
            "code": str(exc.code),
            "message": str(exc.message)[:500],
            "param": exc.param,
            "expected": exc.code in EXPECTED_CODES,
            "path": exc.path,
        }
    }


def is_refusal(row: TrialRecord) -> bool:
    """Whether the trial was refused (its observation is a refusal)."""
    return isinstance(row.observation.get(REFUSAL), Mapping)


def _refusal(row: TrialRecord) -> JsonMapping:
    """A refused trial's refusal (:func:`refusal_observation`)."""
    return json_object(row.observation[REFUSAL])


def _answer(row: TrialRecord) -> str:
    """The trial's released answer (a refusal's status and code), its timing stratum."""
    ref = row.observation.get(REFUSAL)
    if isinstance(ref, Mapping):
        return f"refused {ref.get('status')} {ref.get('code')}"
    for key in ("label", "text"):
        if key in row.observation:
            return str(row.observation[key])
    return str(row.decision)


def _time(seconds: float) -> str:
    """A time as a finding names it (ms below a second)."""
    return f"{seconds * 1e3:.3g} ms" if abs(seconds) < 1 else f"{seconds:.3g} s"


def _shown(p: float) -> str:
    return "0" if p == 0 else f"{p:.2g}" if math.isfinite(p) else str(p)


class RefusalTest(TypedDict):
    """:func:`refusal_test`'s result (stored under a setting's ``refusals``)."""

    status: Literal["ok", "refused", "violation"]
    refused: list[int]
    answered: list[int]
    expected: int
    unexpected: int
    codes: dict[str, int]
    p_value: float | None
    alpha: float
    message: str


def refusal_test(rows: Sequence[TrialRecord], alpha: float) -> RefusalTest | None:
    """Whether refusals depend on the world (module docstring); None where no trial was
    refused. ``refused``/``answered``: per world, C1 then C0."""
    refused = [r for r in rows if is_refusal(r)]
    if not refused:
        return None
    n = [sum(1 for r in rows if r.world == w) for w in (1, 0)]
    k = [sum(1 for r in refused if r.world == w) for w in (1, 0)]
    table = np.array([[k[0], n[0] - k[0]], [k[1], n[1] - k[1]]])
    p_occ = float(stats.fisher_exact(table).pvalue) if min(n) > 0 else 1.0
    body = dependence_test(
        [
            (
                r.world,
                "refused",
                {
                    f"refusal.{f}": _refusal(r).get(f)
                    for f in ("status", "code", "message", "param")
                },
            )
            for r in refused
        ],
        alpha=1.0,
    )
    p_body = body["p_value"] if body is not None and body["p_value"] is not None else 1.0
    p = min(1.0, 2.0 * min(p_occ, float(p_body)))
    codes: dict[str, int] = {}
    for r in refused:
        ref = _refusal(r)
        key = f"{ref.get('status')} {ref.get('code')}"
        codes[key] = codes.get(key, 0) + 1
    expected = sum(1 for r in refused if _refusal(r).get("expected"))
    first = _refusal(refused[0])
    example = f"{first.get('status')} {first.get('code')}: {first.get('message')!s:.200}"
    rates = f"C1 {k[0]}/{n[0]}, C0 {k[1]}/{n[1]}"
    if p < alpha:
        what = (
            "whether a query is answered"
            if p_occ <= float(p_body)
            else f"the refusal's {body['field'] if body else 'body'}"
        )
        status: Literal["ok", "refused", "violation"] = "violation"
        message = (
            f"PRIVACY VIOLATION: the server's refusals depend on the neighbouring world "
            f"({what}; refused {rates}; p = {_shown(p)}, below {alpha:.2g}): a refusal "
            f"releases the private data beside the DP answer (e.g. {example})"
        )
    else:
        status = "refused"
        kind = (
            "its budget exhausted, before the planned count"
            if expected == len(refused)
            else "unexpectedly"
        )
        message = (
            f"the server refused {len(refused)} of {sum(n)} trials ({kind}; {rates}; "
            f"e.g. {example}); the refusals do not depend on the world (p = {_shown(p)}): "
            "the figures read only the answered trials"
        )
    return {
        "status": status,
        "refused": k,
        "answered": [n[0] - k[0], n[1] - k[1]],
        "expected": expected,
        "unexpected": len(refused) - expected,
        "codes": codes,
        "p_value": p,
        "alpha": alpha,
        "message": message,
    }


class TimingTest(TypedDict):
    """:func:`timing_test`'s result (stored under a setting's ``timing``): ``median_s`` the
    median time in C1 and in C0, ``median_difference_s`` C1's minus C0's, ``median_ratio``
    C1's over C0's, ``slower`` the world the test found slower (``answer``: the released
    answer it is most slower at)."""

    status: Literal["ok", "violation", "unchecked"]
    ratio_null: float
    strata: int
    median_s: list[float]
    median_difference_s: float
    median_ratio: float
    p_value: float | None
    slower: str | None
    answer: str | None
    alpha: float
    message: str


def _one_sided(slow: np.ndarray[Any, Any], fast: np.ndarray[Any, Any], ratio: float) -> float:
    """P-value of "``slow`` is more than ``ratio`` times ``fast``" (Mann-Whitney, one-sided,
    on log times shifted by ``log ratio``)."""
    x = np.log(np.maximum(slow, 1e-9)) - math.log(ratio)
    y = np.log(np.maximum(fast, 1e-9))
    return float(stats.mannwhitneyu(x, y, alternative="greater").pvalue)


def timing_test(
    rows: Sequence[TrialRecord], alpha: float, ratio: float = TIME_RATIO
) -> TimingTest | None:
    """Whether one world's answers take more than ``ratio`` times the other's, given the
    released answer (module docstring); None where no trial logged a time."""
    return times_test(
        [(r.world, _answer(r), float(r.latency_s)) for r in rows if r.latency_s is not None],
        alpha,
        ratio,
    )


def times_test(
    samples: Sequence[tuple[int, str, float]], alpha: float, ratio: float = TIME_RATIO
) -> TimingTest | None:
    """:func:`timing_test` of ``(world, released answer, seconds)`` samples, whatever timed
    them (a trial's wall time, a stream's first token: :mod:`dpicl_audit.probes.surface`);
    None where none has a finite time."""
    timed = [(w, a, t) for w, a, t in samples if math.isfinite(t)]
    if not timed:
        return None
    t = {w: np.array([s for v, _, s in timed if v == w]) for w in (1, 0)}
    med = [float(np.median(t[w])) if t[w].size else math.nan for w in (1, 0)]
    strata: dict[str, dict[int, list[float]]] = {}
    for world, answer, seconds in timed:
        strata.setdefault(answer, {1: [], 0: []})[world].append(seconds)
    found: dict[int, list[tuple[float, str, float]]] = {1: [], 0: []}
    for answer, side in sorted(strata.items()):
        if len(side[1]) < 2 or len(side[0]) < 2:
            continue
        a, b = np.array(side[1]), np.array(side[0])
        shift = float(np.median(a) / max(np.median(b), 1e-12))
        found[1].append((_one_sided(a, b, ratio), answer, shift))
        found[0].append((_one_sided(b, a, ratio), answer, 1.0 / shift if shift else math.inf))
    tested = len(found[1])

    def result(
        status: Literal["ok", "violation", "unchecked"],
        p: float | None,
        slower: str | None,
        answer: str | None,
        message: str,
    ) -> TimingTest:
        return {
            "status": status,
            "ratio_null": ratio,
            "strata": tested,
            "median_s": med,
            "median_difference_s": med[0] - med[1],
            "median_ratio": med[0] / med[1] if med[1] > 0 else math.inf,
            "p_value": p,
            "slower": slower,
            "answer": answer,
            "alpha": alpha,
            "message": message,
        }

    if not tested:
        return result(
            "unchecked",
            None,
            None,
            None,
            "timing could not be tested (too few trials per released answer)",
        )
    direction: dict[int, float] = {}
    for w in (1, 0):
        ps = [p for p, _, _ in found[w]]
        direction[w] = (
            ps[0] if len(ps) == 1 else float(stats.combine_pvalues(ps, method="fisher").pvalue)
        )
    w = min(direction, key=lambda k: direction[k])
    p = min(1.0, 2.0 * direction[w])
    where = min(found[w])[1]
    slow, fast = (med[0], med[1]) if w == 1 else (med[1], med[0])
    if p < alpha:
        status: Literal["ok", "violation", "unchecked"] = "violation"
        message = (
            f"PRIVACY VIOLATION: response time depends on the neighbouring world given the "
            f"released answer: C{w}'s answers take more than {ratio:g} times C{1 - w}'s "
            f"(median {_time(slow)} against {_time(fast)}, difference "
            f"{_time(slow - fast)}; most at answer {where!r}; p = {_shown(p)} "
            f"over {tested} answers, below {alpha:.2g}): the time releases the private data"
        )
    else:
        status = "ok"
        message = (
            f"response time does not depend on the world beyond a factor {ratio:g} (median "
            f"C1 {_time(med[0])}, C0 {_time(med[1])}; p = {_shown(p)} over "
            f"{tested} answers)"
        )
    return result(status, p, f"C{w}", where, message)
