"""Does the server add the noise it claims? A chi-square check on the debug residuals.

Bootstrap auditing (Algorithm 1 of paper 000) simulates the noise with the sigma the server
*reports*. On its own it therefore cannot see a server whose noise is smaller than it says:
the simulation would add the claimed noise, not the real one, and the audit would look fine.
The ``internal`` debug endpoint returns, for every query, the clean vote histogram *and* the
noisy one the server actually released, so the residuals ``noisy - clean`` are draws of the
server's real noise: independent ``N(0, sigma_true^2)``, one per label and query.

With ``N`` distinct residuals (a value repeated exactly counts once: continuous noise never
repeats, so repeats are one draw) and ``S = sum r^2``, ``S / sigma_true^2 ~ chi^2_N``
exactly, which gives the two-sided interval (at confidence ``c``, ``a = 1 - c``)::

    sigma_lower = sqrt(S / chi2_N.ppf(1 - a/2)),   sigma_upper = sqrt(S / chi2_N.ppf(a/2)).

Verdicts, for a claimed sigma ``s``:

* ``smaller``: ``sigma_upper < s``, the noise is smaller than claimed (a privacy bug: the
  server is less private than it says);
* ``larger``: ``sigma_lower > s`` (more noise than claimed: not a privacy problem, but the
  reported sigma is wrong);
* ``consistent``: the interval contains ``s`` and is narrower than the measured sigma;
* ``inconclusive``: the interval contains ``s`` but is wider than the measured sigma itself
  (too few residuals: it would also have contained a sigma far from ``s``, so it confirms
  nothing); the claimed sigma is used, as for ``consistent``;
* ``unchecked``: no residuals (e.g. a log collected before this check existed).

When the check disagrees with the claim (``smaller`` or ``larger``) the bootstrap simulates
with ``sigma_upper`` instead of the claimed sigma: the conservative choice for a *lower* bound
on epsilon (more noise, less apparent leakage), valid whenever ``sigma_true <= sigma_upper``,
which fails with probability at most ``a/2``. When they agree the claimed sigma is used, so an
honest server keeps the tight audit.

**False-failure rate.** The default confidence is ``1 - 1e-6``: an honest server is flagged
(either way) with probability at most 1e-6 per check, and the bootstrap's epsilon lower bound
loses at most 5e-7 of its confidence through the sigma it simulates with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonObject

__all__ = [
    "DEFAULT_NOISE_CONFIDENCE",
    "NoiseCheck",
    "NoiseStatus",
    "check_noise",
    "residuals_from_observations",
]

DEFAULT_NOISE_CONFIDENCE = 1.0 - 1e-6
"""Two-sided: an honest server is flagged with probability at most 1e-6 per check."""

NoiseStatus = Literal["consistent", "inconclusive", "smaller", "larger", "unchecked"]


@dataclass(frozen=True)
class NoiseCheck:
    """The result of one check: the interval for the real sigma and what to simulate with."""

    claimed_sigma: float
    n_residuals: int
    sigma_hat: float | None  # sqrt(S / N), the maximum-likelihood estimate (mean known: 0)
    sigma_lower: float | None
    sigma_upper: float | None
    confidence: float
    status: NoiseStatus
    simulation_sigma: float  # the sigma the bootstrap should simulate with
    message: str

    @property
    def flagged(self) -> bool:
        """True when the noise is smaller than claimed (the privacy-relevant disagreement)."""
        return self.status == "smaller"

    def to_dict(self) -> JsonObject:
        out = asdict(self)
        out["flagged"] = self.flagged
        return out


def residuals_from_observations(
    observations: Iterable[Mapping[str, object]], labels: Sequence[str]
) -> npt.NDArray[np.float64]:
    """``noisy_votes[l] - clean_votes[l]`` for every label of every observation that has both.

    Observations without both mappings are skipped (black-box trials, ``noisy`` white-box).
    """
    out: list[float] = []
    for obs in observations:
        noisy, clean = obs.get("noisy_votes"), obs.get("clean_votes")
        if not isinstance(noisy, Mapping) or not isinstance(clean, Mapping):
            continue
        for lab in labels:
            if lab not in noisy or lab not in clean:
                raise InvalidAuditInput(
                    f"a debug observation lacks the label {lab!r} in its noisy or clean votes"
                )
            out.append(float(noisy[lab]) - float(clean[lab]))
    arr = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise InvalidAuditInput("the debug votes hold non-finite values")
    return arr


def check_noise(
    residuals: npt.ArrayLike,
    claimed_sigma: float,
    *,
    confidence: float = DEFAULT_NOISE_CONFIDENCE,
) -> NoiseCheck:
    """Compare the noise in ``residuals`` (``noisy - clean``) with ``claimed_sigma``.

    See the module docstring for the interval, the verdicts and the false-failure rate.
    """
    s = float(claimed_sigma)
    if not (math.isfinite(s) and s >= 0.0):
        raise InvalidAuditInput(f"claimed_sigma must be finite and >= 0, got {claimed_sigma!r}")
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise InvalidAuditInput(f"confidence must lie in (0, 1), got {confidence!r}")
    r = np.asarray(residuals, dtype=np.float64).ravel()
    if not np.all(np.isfinite(r)):
        raise InvalidAuditInput("residuals must be finite")
    # Sized by the true degrees of freedom: a residual value that repeats exactly is one draw
    # of a continuous noise, not many (a server that reuses its noise would otherwise count
    # 4 distinct values as hundreds); the repeats themselves are conformance's determinism.
    r = np.unique(r) if r.size else r
    n = int(r.size)
    if n == 0:
        return NoiseCheck(
            s,
            0,
            None,
            None,
            None,
            c,
            "unchecked",
            s,
            "no noisy/clean vote pairs for this setting: the claimed sigma is used unchecked",
        )
    ss = float(np.dot(r, r))
    alpha = 1.0 - c
    q_hi = float(stats.chi2.isf(alpha / 2.0, n))  # upper quantile -> lower sigma bound
    q_lo = float(stats.chi2.ppf(alpha / 2.0, n))  # lower quantile -> upper sigma bound
    lower = math.sqrt(ss / q_hi)
    upper = math.sqrt(ss / q_lo) if q_lo > 0.0 else math.inf
    hat = math.sqrt(ss / n)
    ci = f"[{lower:.4g}, {upper:.4g}] at {c:.6g} confidence from {n} residuals"
    status: NoiseStatus
    if upper < s:
        status, sim = "smaller", upper
        msg = (
            f"NOISE SMALLER THAN CLAIMED: the server reports sigma {s:.4g} but its debug "
            f"residuals put the real sigma in {ci}; the bootstrap simulates with {upper:.4g}"
        )
    elif lower > s:
        status, sim = "larger", upper
        msg = (
            f"noise larger than claimed: reported sigma {s:.4g}, real sigma in {ci}; the "
            f"bootstrap simulates with {upper:.4g}"
        )
    elif upper - lower > hat:
        status, sim = "inconclusive", s
        msg = (
            f"INCONCLUSIVE: the reported sigma {s:.4g} lies in the real sigma's interval {ci}, "
            f"but the interval is wider than the measured sigma {hat:.4g}: too few residuals "
            "to confirm the noise (more bootstrap rows, n_llm, would narrow it)"
        )
    else:
        status, sim = "consistent", s
        msg = f"the reported sigma {s:.4g} lies in the real sigma's interval {ci}"
    return NoiseCheck(s, n, hat, lower, upper, c, status, sim, msg)
