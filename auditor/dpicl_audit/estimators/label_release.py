"""The released label of private voting: its exact (epsilon, delta) and the pivotal canary design.

A black-box audit of private voting sees only the noisy argmax. For two neighbouring vote
histograms ``h1`` (canary present) and ``h0`` the released label has a distribution over the
labels in each world, ``P1`` and ``P0``, and the best any black-box audit can prove is the
exact (epsilon, delta) of that pair of discrete distributions (the hockey-stick divergence in
both directions)::

    delta(eps) = max( sum_o max(0, P1(o) - e^eps P0(o)), sum_o max(0, P0(o) - e^eps P1(o)) )

For two labels the release is a pair of Bernoulli distributions with
``P(A) = Phi((a - b) / (sigma sqrt 2))`` (the difference of two independent ``N(0, sigma^2)``
noises is ``N(0, 2 sigma^2)``; ties have probability zero), and for epsilon >= 0 only one
outcome can contribute per direction, so the inverse is closed form::

    eps = max(log((p1 - delta) / p0), log((1 - p0 - delta) / (1 - p1)),
              log((p0 - delta) / p1), log((1 - p1 - delta) / (1 - p0)), 0)

(issue 14's example: epsilon 8, delta 1e-5, votes (1, 3) against (0, 4): 4.63.)

**Pivotal canary design.** With two labels and ``T = 2m + 1`` partitions, pin the other
``2m`` partitions to ``m`` votes each; the canary partition then decides: C1 = [m+1, m],
C0 = [m, m+1]. The clean gaps are +1 and -1, so at the natural decision "released A":
``TPR = Phi(1 / (sigma sqrt 2))``, ``FPR = Phi(-1 / (sigma sqrt 2))`` and
``Phi^-1(TPR) - Phi^-1(FPR) = 2 / (sigma sqrt 2) = sqrt(2) / sigma``, the mechanism's own mu
(sensitivity sqrt 2 over sigma). Any offset of the two gaps (``d1 = d0 + 2``) gives the same
mu; the balanced one puts both rates mid-range, where Clopper-Pearson intervals are
narrowest, so it is the most powerful for the GDP figure. The *classical* epsilon of the
binary release depends on the offset and is larger in the tails (see
:func:`label_release_epsilon`); :func:`pivotal_votes` takes the offset as ``gap``.
For even ``T = 2m`` no balanced split exists: the tie rule says which world holds the clean
tie [m, m] (released A with probability 1/2 under continuous noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import optimize, special

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.rdp import noisy_argmax_log_probabilities
from dpicl_audit.estimators.stats import FloatArray, check_delta

__all__ = [
    "PivotalDesign",
    "TieRule",
    "binary_release_epsilon",
    "discrete_epsilon",
    "label_release_epsilon",
    "label_release_probabilities",
    "pivotal_design",
    "pivotal_rates",
    "pivotal_votes",
]

TieRule = Literal["tie_with", "tie_without"]


def _probabilities(p: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise InvalidAuditInput(f"{name} must be a 1-D distribution over >= 2 outcomes")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0.0) or abs(float(arr.sum()) - 1.0) > 1e-9:
        raise InvalidAuditInput(f"{name} must be non-negative and sum to 1, got {arr!r}")
    return arr


def _hockey(p: FloatArray, q: FloatArray, eps: float) -> float:
    return float(np.sum(np.maximum(0.0, p - math.exp(eps) * q)))


def discrete_epsilon(p: npt.ArrayLike, q: npt.ArrayLike, delta: float) -> float:
    """Exact epsilon at ``delta`` between two distributions on the same finite outcomes.

    The smallest ``eps >= 0`` whose hockey-stick divergence is at most ``delta`` in both
    directions (``inf`` when an outcome impossible in one world has mass above ``delta`` in
    the other). Solved by Brent's method: the divergence decreases in epsilon.
    """
    pa, qa = _probabilities(p, "p"), _probabilities(q, "q")
    if pa.shape != qa.shape:
        raise InvalidAuditInput(f"p and q differ in size: {pa.size} against {qa.size}")
    d = check_delta(delta)
    worst = 0.0
    for a, b in ((pa, qa), (qa, pa)):
        if float(np.sum(a[b == 0.0])) > d:
            return math.inf
        if _hockey(a, b, 0.0) <= d:
            continue
        hi = 1.0
        while _hockey(a, b, hi) > d:
            hi *= 2.0
        root = optimize.brentq(lambda e, a=a, b=b: _hockey(a, b, e) - d, 0.0, hi)
        worst = max(worst, float(root))
    return worst


def binary_release_epsilon(p1: float, p0: float, delta: float) -> float:
    """Closed-form epsilon at ``delta`` of Bernoulli(p1) against Bernoulli(p0) (module doc)."""
    d = check_delta(delta)
    for name, v in (("p1", p1), ("p0", p0)):
        if not 0.0 <= float(v) <= 1.0:
            raise InvalidAuditInput(f"{name} must be a probability, got {v!r}")
    terms = [0.0]
    for num, den in (
        (p1 - d, p0),
        (1.0 - p0 - d, 1.0 - p1),
        (p0 - d, p1),
        (1.0 - p1 - d, 1.0 - p0),
    ):
        if num > 0.0:
            terms.append(math.inf if den <= 0.0 else math.log(num / den))
    return max(terms)


def label_release_probabilities(votes: npt.ArrayLike, sigma: float) -> FloatArray:
    """P(released label = c) of noisy argmax over ``votes`` with ``N(0, sigma^2)`` per count."""
    h = np.asarray(votes, dtype=np.float64)
    if h.ndim != 1 or h.size < 2:
        raise InvalidAuditInput(f"votes must be a histogram over >= 2 labels, got {votes!r}")
    if h.size == 2:  # closed form: P(A) = Phi((a - b) / (sigma sqrt 2))
        s = float(sigma)
        if not s > 0.0:
            raise InvalidAuditInput(f"sigma must be positive, got {sigma!r}")
        pa = float(special.ndtr((h[0] - h[1]) / (s * math.sqrt(2.0))))
        return np.array([pa, 1.0 - pa])
    return np.exp(noisy_argmax_log_probabilities(h, sigma))


def label_release_epsilon(
    votes_with: npt.ArrayLike, votes_without: npt.ArrayLike, sigma: float, delta: float
) -> float:
    """Exact epsilon at ``delta`` of the *released label* between two vote histograms.

    The ceiling of every black-box audit of this pair (any decision on the label is a
    post-processing of it). Two labels: closed form; more: the release probabilities of
    :func:`~dpicl_audit.estimators.rdp.noisy_argmax_log_probabilities`, then
    :func:`discrete_epsilon`.
    """
    p1 = label_release_probabilities(votes_with, sigma)
    p0 = label_release_probabilities(votes_without, sigma)
    if p1.shape != p0.shape:
        raise InvalidAuditInput(f"histograms differ in size: {p1.size} against {p0.size}")
    if p1.size == 2:
        return binary_release_epsilon(float(p1[0]), float(p0[0]), delta)
    return discrete_epsilon(p1 / p1.sum(), p0 / p0.sum(), delta)


@dataclass(frozen=True)
class PivotalDesign:
    """Vote configuration of a pivotal canary.

    ``votes_with``/``votes_without``: clean histograms of C1/C0 over ``n_labels`` labels
    (label 0 = "A", the canary's label in C1; label 1 = "B", its label in C0).
    ``other_labels``: the label index each of the ``T - 1`` other partitions must vote
    (pinned, the same in both worlds), so the pair differs only at the canary's partition.
    """

    partitions: int
    n_labels: int
    votes_with: tuple[int, ...]
    votes_without: tuple[int, ...]
    other_labels: tuple[int, ...]

    @property
    def gap_with(self) -> int:
        """Clean vote gap A - B with the canary."""
        return self.votes_with[0] - self.votes_with[1]

    @property
    def gap_without(self) -> int:
        """Clean vote gap A - B without it (always ``gap_with - 2``)."""
        return self.votes_without[0] - self.votes_without[1]


def pivotal_design(
    partitions: int,
    n_labels: int = 2,
    *,
    gap: int | None = None,
    tie_rule: TieRule = "tie_without",
) -> PivotalDesign:
    """Vote configuration whose released label the canary's partition decides.

    ``gap`` is the clean gap A - B in C1 (C0's is ``gap - 2``); it must have the parity of
    ``T`` and be reachable (``|gap| <= T`` and ``|gap - 2| <= T``). Default: the balanced
    design, gap 1 for odd ``T`` (C1 = [m+1, m], C0 = [m, m+1]); for even ``T`` the
    ``tie_rule`` puts the tie [m, m] in C0 (``"tie_without"``: C1 = [m+1, m-1]) or in C1
    (``"tie_with"``: C0 = [m-1, m+1]). Extra labels (``n_labels > 2``) get no votes.
    """
    t = int(partitions)
    if t < 1 or t != partitions:
        raise InvalidAuditInput(f"partitions must be a positive integer, got {partitions!r}")
    if n_labels < 2:
        raise InvalidAuditInput(f"n_labels must be at least 2, got {n_labels!r}")
    if gap is None:
        if t % 2:
            g = 1
        elif tie_rule == "tie_without":
            g = 2
        elif tie_rule == "tie_with":
            g = 0
        else:
            raise InvalidAuditInput(
                f"tie_rule must be 'tie_with' or 'tie_without', got {tie_rule!r}"
            )
    else:
        g = int(gap)
    if (g - t) % 2 or abs(g) > t or abs(g - 2) > t:
        raise InvalidAuditInput(
            f"gap {gap!r} is not reachable with {t} partitions (needs the parity of T and "
            f"|gap| <= T, |gap - 2| <= T)"
        )
    a1 = (t + g) // 2  # C1: a1 votes for A (the canary's included), t - a1 for B
    others_a = a1 - 1
    others_b = t - 1 - others_a
    with_votes = [a1, t - a1] + [0] * (n_labels - 2)
    without_votes = [a1 - 1, t - a1 + 1] + [0] * (n_labels - 2)
    return PivotalDesign(
        partitions=t,
        n_labels=n_labels,
        votes_with=tuple(with_votes),
        votes_without=tuple(without_votes),
        other_labels=tuple([0] * others_a + [1] * others_b),
    )


def pivotal_votes(
    partitions: int, n_labels: int = 2, *, tie_rule: TieRule = "tie_without"
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(votes_with, votes_without)`` of the balanced pivotal design (:func:`pivotal_design`)."""
    d = pivotal_design(partitions, n_labels, tie_rule=tie_rule)
    return d.votes_with, d.votes_without


def pivotal_rates(design: PivotalDesign, sigma: float) -> tuple[float, float, float]:
    """``(TPR, FPR, mu)`` of the decision "released label is A" on ``design``.

    Two labels: ``TPR = Phi(gap_with / (sigma sqrt 2))``, ``FPR = Phi(gap_without / ...)`` and
    ``mu = Phi^-1(TPR) - Phi^-1(FPR) = sqrt(2) / sigma``. More labels: exact release
    probabilities; ``mu`` is then the probit gap of those rates.
    """
    tpr = float(label_release_probabilities(design.votes_with, sigma)[0])
    fpr = float(label_release_probabilities(design.votes_without, sigma)[0])
    mu = float(special.ndtri(tpr) - special.ndtri(fpr))
    return tpr, fpr, mu
