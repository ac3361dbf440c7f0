"""Conformance: does the server release what its design predicts? (issue 27)

A bound on epsilon says how much a server leaks; it does not say whether the server runs the
mechanism it claims. A server that is broken in a way that leaks *less* than the claim at the
audited design (an exemplar that reaches two partitions, noise of the right variance but the
wrong shape, noise reused across queries) keeps its bound below the claim and would read
CONSISTENT. Each design therefore predicts the *distribution* of what the server releases, and
the auditor tests the observed releases against that prediction:

* black-box, a design whose clean outputs are known (voting's and ESA's designs on the
  rule-following simulator): the release rate in each world against the closed form
  (two-sided exact binomial tests);
* white-box, where the debug endpoint shows the noise (``noisy - clean``, or ``noisy`` minus
  the design's known clean values on the simulator): the noise itself, per coordinate and
  jointly (:func:`residual_tests`): its scale (two-sided chi-square, per coordinate and along
  fixed directions, which sees correlation across labels or dimensions), its tails (the
  fraction beyond 2 sigma, exact binomial; and a Kolmogorov-Smirnov test of the shape),
  independence across repeated identical queries (lag-1 products) and determinism (a
  continuous noise never repeats a value exactly).
* black-box and white-box, every mechanism and engine: the order of each world's released
  answers against exchangeability (:mod:`.exchangeable`: fresh randomness per answer makes
  any order as likely as the one observed, whatever the model).

**Degrees of freedom.** Every test counts what is independent: answers that repeat exactly are
one draw, not many (they are reported as determinism, and the scale tests use the distinct
answers only), and a coordinate's scale test has one degree of freedom per distinct answer.

**Error rate.** The conformance tests are one member of the run's family
(:mod:`~dpicl_audit.estimators.family`): together they get ``min((1 - c) / m, 1e-4)`` of
error, ``m`` the run's family size, shared equally by the run's settings and, within a setting,
by its tests (Bonferroni). So the run's claims *and* its conformance findings hold together at
its confidence, and an honest server reads NONCONFORMING in at most 1 run in 10,000, the rate of
every other test a run states a finding from (:data:`CONFORMANCE_ERROR`).

A significant departure is the verdict NONCONFORMING
(:meth:`dpicl_audit.verdicts.Verdict.read_with`), naming what differs; it never reads
CONSISTENT. A VIOLATION or BUG stays (it is worse).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import integrate, stats

from dpicl_audit.claims import Family
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.stats import FloatArray
from dpicl_audit.jsontypes import JsonObject, JsonValue

__all__ = [
    "CONFORMANCE_ERROR",
    "Conformance",
    "ConformanceTest",
    "conformance_alpha",
    "determinism_test",
    "rate_tests",
    "residual_tests",
    "summarise",
]

CONFORMANCE_ERROR = 1e-4
"""The most error a run's conformance tests get together (an honest server's false alarm).

1e-4, the rate of the run's other tests (the channels, the parameters sweep, the limits, the
tails). It was 1e-3: exchangeability is a sharp null, so an honest server meets that rate
exactly, and the suite runs dozens of honest audits that must exit 0 (148 honest voting
audits at epsilon 4 on a loaded machine, 2026-11-29: one C0 world with 282 of 484 adjacent
answers identical, p = 1.3e-4 against its 2.5e-4, exit 4)."""

#: P(|Z| > 2) for a standard normal: the tails test's expected exceedance.
_TAIL_K = 2.0
_TAIL_P = float(2.0 * stats.norm.sf(_TAIL_K))

What = Literal[
    "release rate", "noise scale", "correlation", "tails", "independence", "determinism", "sampling"
]


@dataclass(frozen=True, slots=True)
class ConformanceTest:
    """One test of the prediction: what it checks, its statistic, p-value and df."""

    what: str
    name: str
    p_value: float
    statistic: float
    df: int
    detail: str

    def to_dict(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class Conformance:
    """A setting's tests at per-test error ``alpha`` (its share of the run's family)."""

    alpha: float
    tests: tuple[ConformanceTest, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> list[ConformanceTest]:
        return [t for t in self.tests if t.p_value < self.alpha]

    @property
    def status(self) -> str:
        if not self.tests:
            return "untested"
        return "nonconforming" if self.failed else "conforming"

    def to_dict(self) -> JsonObject:
        failed = self.failed
        # Built as JSON values (a list[str] is not one: list is invariant).
        differs: list[JsonValue] = [w for w in sorted({t.what for t in failed})]
        if not self.tests:
            message = "nothing in this setting has a predicted distribution to test"
        elif failed:
            message = "the releases depart from the design's prediction: " + "; ".join(
                f"{t.what} ({t.detail}, p = {t.p_value:.3g} < {self.alpha:.3g})" for t in failed
            )
        else:
            message = (
                f"the releases match the design's prediction ({len(self.tests)} tests, each "
                f"at error {self.alpha:.3g})"
            )
        return {
            "status": self.status,
            "alpha": self.alpha,
            "differs": differs,
            "message": message,
            "tests": [t.to_dict() for t in self.tests],
        }


def conformance_alpha(family: Family | None, n_tests: int) -> float:
    """Each of a setting's ``n_tests`` tests' error: the conformance member's share of the
    run's family (size, confidence, settings; None: a lone test), split over the settings
    and the tests (module docstring)."""
    family = family or Family(1, 0.95)
    conf = family.confidence
    size = max(1, family.size)
    settings = max(1, family.settings)
    total = min((1.0 - conf) / size, CONFORMANCE_ERROR)
    return total / settings / max(1, n_tests)


def _binom(k: int, n: int, p: float) -> float:
    if n == 0:
        return 1.0
    return float(stats.binomtest(k, n, min(max(p, 0.0), 1.0)).pvalue)


def rate_tests(tp: int, n1: int, fp: int, n0: int, rates: Sequence[float]) -> list[ConformanceTest]:
    """The release rate of the positive answer in each world against the design's closed
    form ``rates`` (with the canary, without): two-sided exact binomial tests."""
    out = []
    for world, k, n, p in (("C1", tp, n1, rates[0]), ("C0", fp, n0, rates[1])):
        if n == 0:
            continue
        out.append(
            ConformanceTest(
                what="release rate",
                name=f"release_rate_{world}",
                p_value=_binom(k, n, float(p)),
                statistic=k / n,
                df=n,
                detail=f"{world} released the positive answer in {k}/{n} = {k / n:.3f} of "
                f"trials, the design predicts {float(p):.3f}",
            )
        )
    return out


def _chi2_two_sided(ss: float, df: int) -> float:
    lo = float(stats.chi2.cdf(ss, df))
    return min(1.0, 2.0 * min(lo, 1.0 - lo))


def product_sum_two_sided(total: float, m: int) -> float:
    """Two-sided p-value of ``total`` = sum over ``m`` answers of ``x_i * y_i``, for
    independent standard normal ``x`` and ``y`` (exact, for any ``m``).

    ``x * y = (U^2 - V^2) / 2`` with ``U = (x + y)/sqrt(2)`` and ``V = (x - y)/sqrt(2)``
    independent N(0, 1), so the sum is ``(A - B) / 2`` with ``A``, ``B`` independent
    chi-square(m): ``P(|sum| >= s) = 2 E_B[P(A >= 2 s + B)]``. The normal approximation
    (``sqrt(m) rho ~ N(0, 1)``) is far too light-tailed for few answers: two answers whose
    noises multiply to -6.9 read p = 1e-6 there, 1e-3 here, and flagged an honest server.
    """
    if m < 1:
        raise InvalidAuditInput(f"m must be >= 1, got {m}")
    t = 2.0 * abs(float(total))
    lo, hi = float(stats.chi2.ppf(1e-14, m)), float(stats.chi2.isf(1e-14, m))
    val, _ = integrate.quad(
        lambda b: float(stats.chi2.sf(t + b, m) * stats.chi2.pdf(b, m)), lo, hi, limit=200
    )
    return min(1.0, 2.0 * float(val))


def residual_tests(
    residuals: npt.ArrayLike,
    sigma: float,
    *,
    groups: Sequence[Any] | None = None,
    directions: npt.ArrayLike | None = None,
    names: Sequence[str] | None = None,
) -> list[ConformanceTest]:
    """Tests of ``residuals`` (``n`` answers x ``d`` coordinates, in query order) against
    independent ``N(0, sigma^2)`` noise in every coordinate.

    ``groups``: which context each answer came from (the lag-1 independence test pairs
    consecutive answers of one context); ``directions``: unit vectors along which the
    scale is tested too (correlation across dimensions; for ``d <= 8`` every pair of
    coordinates is tested by its correlation instead); ``names``: coordinate names."""
    r = np.asarray(residuals, dtype=np.float64)
    if r.ndim == 1:
        r = r[:, None]
    if r.ndim != 2 or not np.all(np.isfinite(r)):
        raise InvalidAuditInput("residuals must be a finite n x d array")
    s = float(sigma)
    if not (s > 0 and math.isfinite(s)):
        raise InvalidAuditInput(f"sigma must be positive and finite, got {sigma!r}")
    n, d = r.shape
    if n < 2:
        return []
    # Determinism: a continuous noise never repeats an answer exactly.
    distinct, first = np.unique(r, axis=0, return_index=True)
    out = _repeats(n, int(distinct.shape[0]))
    # The distinct answers only: repeats are one draw (their true degrees of freedom).
    kept = np.sort(first)
    u = r[kept] / s
    label = list(names) if names is not None and len(names) == d else [str(j) for j in range(d)]
    out.append(_scale_per_coordinate(u, s, label))
    if 1 < d <= 8:  # jointly: correlation across coordinates
        out += _pair_correlations(u, label)
    elif d > 8 and directions is not None:
        out.append(_scale_along(u, s, directions))
    out += _tails(u)
    g = np.asarray(list(groups) if groups is not None else [0] * n, dtype=object)
    out += _lag1(u, g[kept])
    return out


def determinism_test(values: npt.ArrayLike) -> list[ConformanceTest]:
    """A finding where some of the n noisy answers (rows of ``values``) repeat one exactly:
    continuous noise never does. Empty where all are distinct."""
    v = np.asarray(values)
    return _repeats(v.shape[0], int(np.unique(v, axis=0).shape[0]))


def _repeats(n: int, n_distinct: int) -> list[ConformanceTest]:
    if n_distinct == n:
        return []
    return [
        ConformanceTest(
            "determinism",
            "repeated_answers",
            0.0,
            float(n - n_distinct),
            n,
            f"{n - n_distinct} of {n} noisy answers repeat an earlier one exactly "
            "(continuous noise never does)",
        )
    ]


def _scale_per_coordinate(u: FloatArray, s: float, label: list[str]) -> ConformanceTest:
    """Scale per coordinate (Bonferroni over the d coordinates inside this one test)."""
    m, d = u.shape
    ss = np.sum(u * u, axis=0)
    p_coord = np.array([_chi2_two_sided(float(v), m) for v in ss])
    j = int(np.argmin(p_coord))
    return ConformanceTest(
        "noise scale",
        "scale_per_coordinate",
        min(1.0, float(p_coord[j]) * d),
        float(math.sqrt(ss[j] / m) * s),
        m,
        f"coordinate {label[j]}'s noise has sigma {math.sqrt(ss[j] / m) * s:.4g} over {m} "
        f"answers, the server reports {s:.4g}"
        + (f" (the least likely of {d} coordinates)" if d > 1 else ""),
    )


def _pair_correlations(u: FloatArray, label: list[str]) -> list[ConformanceTest]:
    m, d = u.shape
    worst: tuple[float, float, str] | None = None
    pairs = d * (d - 1) // 2
    for a in range(d):
        for b in range(a + 1, d):
            # Known mean 0 and scale: sum of products / m is the correlation; its
            # exact null distribution (product_sum_two_sided), not a normal one.
            total = float(np.dot(u[:, a], u[:, b]))
            rho = total / m
            p = product_sum_two_sided(total, m)
            if worst is None or p < worst[0]:
                worst = (p, rho, f"{label[a]} and {label[b]}")
    if worst is None:
        return []
    return [
        ConformanceTest(
            "correlation",
            "correlation_across_coordinates",
            min(1.0, worst[0] * pairs),
            worst[1],
            m,
            f"the noise of {worst[2]} correlates at {worst[1]:.3f} over {m} answers "
            "(independent noise: 0)",
        )
    ]


def _scale_along(u: FloatArray, s: float, directions: npt.ArrayLike) -> ConformanceTest:
    m = u.shape[0]
    dirs = np.atleast_2d(np.asarray(directions, dtype=np.float64))
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    proj = u @ dirs.T
    pss = np.sum(proj * proj, axis=0)
    p_dir = np.array([_chi2_two_sided(float(v), m) for v in pss])
    k = int(np.argmin(p_dir))
    return ConformanceTest(
        "correlation",
        "scale_along_directions",
        min(1.0, float(p_dir[k]) * len(dirs)),
        float(math.sqrt(pss[k] / m) * s),
        m,
        f"along fixed direction {k} the noise has sigma {math.sqrt(pss[k] / m) * s:.4g} "
        f"(independent coordinates of sigma {s:.4g} give {s:.4g} in every direction)",
    )


def _tails(u: FloatArray) -> list[ConformanceTest]:
    """The fraction beyond 2 sigma (exact binomial) and the shape (KS), pooled."""
    flat = u.ravel()
    beyond = int(np.sum(np.abs(flat) > _TAIL_K))
    ks = stats.kstest(flat, "norm")
    return [
        ConformanceTest(
            "tails",
            "beyond_2_sigma",
            _binom(beyond, flat.size, _TAIL_P),
            beyond / flat.size,
            flat.size,
            f"{beyond} of {flat.size} noise values lie beyond 2 sigma, a Gaussian puts "
            f"{_TAIL_P:.2%} there",
        ),
        ConformanceTest(
            "tails",
            "shape_ks",
            float(ks.pvalue),
            float(ks.statistic),
            flat.size,
            f"the noise's distribution differs from the Gaussian's by KS {float(ks.statistic):.3g}",
        ),
    ]


def _lag1(u: FloatArray, g: npt.NDArray[np.object_]) -> list[ConformanceTest]:
    """Independence across repeated identical queries: consecutive answers of one context."""
    d = u.shape[1]
    total, count = 0.0, 0
    for key in dict.fromkeys(g.tolist()):
        block = u[g == key]
        if block.shape[0] >= 2:
            total += float(np.sum(block[1:] * block[:-1]))
            count += (block.shape[0] - 1) * d
    if not count:
        return []
    z = total / math.sqrt(count)
    return [
        ConformanceTest(
            "independence",
            "lag1_products",
            float(2.0 * stats.norm.sf(abs(z))),
            total / count,
            count,
            f"consecutive answers to the same query correlate at {total / count:.3f} "
            f"({count} pairs; independent noise: 0)",
        )
    ]


def summarise(tests: Sequence[ConformanceTest], family: Family | None) -> JsonObject:
    """The setting's conformance dict at its share of the run's error."""
    return Conformance(conformance_alpha(family, len(tests)), tuple(tests)).to_dict()
