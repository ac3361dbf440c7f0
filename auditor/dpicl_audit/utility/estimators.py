"""The utility audit's estimators: pure functions over numpy arrays (generator passed in).

* :func:`accuracy_interval`: the exact (Clopper-Pearson 1934) two-sided interval of a
  binomial proportion, from scipy's ``binomtest``: correct answers among independent
  queries are Bernoulli trials, and the exact interval never covers less than its level.
* :func:`rouge_l`: ROUGE-L F-measure of one text against its reference (Lin 2004, Section 3.1,
  equations 2-4: LCS recall and precision over word tokens, F with beta = 1).
* :func:`bootstrap_interval`: the percentile bootstrap interval of a mean (Efron and
  Tibshirani 1993, Section 13.3); ROUGE-L scores have no closed-form sampling law.
* :func:`interval_width` and :func:`queries_for_width`: the widest Clopper-Pearson interval
  ``n`` queries give (at accuracy 0.5), and the queries a target width needs: the defaults
  are chosen from them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import binomtest

from dpicl_audit.utility.results import IntervalJson

__all__ = [
    "CONFIDENCE",
    "Interval",
    "accuracy_interval",
    "bootstrap_interval",
    "interval_width",
    "queries_for_width",
    "rouge_l",
]

CONFIDENCE = 0.95

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate with its two-sided interval at ``confidence`` over ``n`` queries."""

    value: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE
    method: str = "clopper-pearson"

    def to_json(self) -> IntervalJson:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "confidence": self.confidence,
            "method": self.method,
        }


def accuracy_interval(correct: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Accuracy ``correct / n`` with its exact Clopper-Pearson interval."""
    if n <= 0 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n > 0, got correct={correct}, n={n}")
    ci = binomtest(int(correct), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return Interval(correct / n, float(ci.low), float(ci.high), int(n), confidence)


def interval_width(n: int, confidence: float = CONFIDENCE) -> float:
    """The width of the Clopper-Pearson interval of ``n`` queries at accuracy 1/2 (the widest,
    up to the rounding of n/2)."""
    ci = accuracy_interval(n // 2, n, confidence)
    return ci.high - ci.low


def queries_for_width(width: float, confidence: float = CONFIDENCE) -> int:
    """The fewest queries whose widest Clopper-Pearson interval is at most ``width``."""
    if not 0.0 < width < 1.0:
        raise ValueError(f"width must be in (0, 1), got {width}")
    # The normal approximation's n = (2 z / width)^2 / 4 is a lower start; step up from it.
    z = 1.959963984540054
    n = max(1, math.floor((z / width) ** 2) - 5)
    while interval_width(n, confidence) > width:
        n += 1
    return n


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _lcs(a: list[str], b: list[str]) -> int:
    """The length of the longest common subsequence (dynamic programme, O(len a * len b))."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 (Lin 2004, eqs. 2-4 with beta = 1) over lower-cased word tokens; 0 when
    either text has no word."""
    c, r = _words(candidate), _words(reference)
    lcs = _lcs(c, r)
    if lcs == 0:
        return 0.0
    recall, precision = lcs / len(r), lcs / len(c)
    return 2 * recall * precision / (recall + precision)


def bootstrap_interval(
    scores: npt.ArrayLike,
    rng: np.random.Generator,
    *,
    resamples: int = 2000,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The mean of ``scores`` with its percentile bootstrap interval (``resamples`` resamples
    of the queries with replacement, drawn from ``rng``)."""
    x = np.asarray(scores, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"need a non-empty 1-d array of scores, got shape {x.shape}")
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    means = x[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(x.mean()), float(low), float(high), int(x.size), confidence, "bootstrap")
