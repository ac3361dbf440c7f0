"""DPS-MOZO's stored record, typed (:class:`MozoCalibration`), its own accountant and its
cost event: the epsilon of n answers of T_max tokens, proven (:mod:`.proven`) or the paper's
nominal RDP (:mod:`.calibration`)."""

from __future__ import annotations

from functools import partial
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dpicl.mechanisms.dps_mozo.calibration import mozo_epsilon
from dpicl.mechanisms.dps_mozo.proven import proven_epsilon
from dpicl.privacy.ledger import Cost


class MozoCalibration(BaseModel):
    """A DPS-MOZO context's stored record: its settings (``delta`` resolved, ``alpha``
    chosen in the paper's mode) and what calibration derived, in the order stored. The
    proven mode stores ``max_log_ratio``, ``per_token_epsilon`` and
    ``amplified_per_token_epsilon``; the paper's stores the first two as null and ``beta``,
    ``radius``, ``rdp_epsilon`` and ``per_token_rdp`` instead."""

    # As stored: no bounds (a server's limits may have changed since), other fields ignored.
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: Literal["dps-mozo"] = "dps-mozo"
    epsilon: float
    delta: float
    # Contexts stored before the proven mode existed are paper-mode contexts.
    guarantee: Literal["proven", "paper"] = "paper"
    alpha: int | None = None
    n_shots: int
    top_k: int
    max_tokens: int
    queries: int
    lambda_max: float
    max_log_ratio: float | None = None
    per_token_epsilon: float | None = None
    amplified_per_token_epsilon: float | None = None
    beta: float | None = None
    radius: float | None = None
    rdp_epsilon: float | None = None
    per_token_rdp: float | None = None
    sample_rate: float
    tokens: int | None = None

    @property
    def proven(self) -> bool:
        return self.guarantee == "proven"

    def eps0(self) -> float:
        """The proven mode's per-shot max log-ratio bound."""
        assert self.max_log_ratio is not None, "a proven-mode record stores max_log_ratio"
        return self.max_log_ratio

    def paper_order(self) -> tuple[float, int]:
        """The paper mode's (beta, alpha)."""
        assert self.beta is not None and self.alpha is not None, "a paper record stores both"
        return self.beta, self.alpha


def mozo_spent_epsilon(cal: MozoCalibration, queries: int) -> float:
    """(epsilon, delta)-DP epsilon of ``queries`` DPS-MOZO answers of T_max tokens each.

    Every answer is charged its full T_max tokens whatever it generated (stopping early is a
    function of the released tokens), so after all ``cal.queries`` answers this is at most
    the configured epsilon. Proven mode: the exact optimal composition of the amplified
    per-token pure DP (:mod:`dpicl.mechanisms.dps_mozo.proven`). Paper mode (nominal): the
    conversion takes the best order up to alpha.
    """
    tokens = queries * cal.max_tokens
    if cal.proven:
        return proven_epsilon(cal.eps0(), cal.n_shots, cal.sample_rate, tokens, cal.delta)
    beta, alpha = cal.paper_order()
    return mozo_epsilon(beta, alpha, tokens, cal.sample_rate, cal.delta, optimize_order=True)


def mozo_cost(cal: MozoCalibration) -> Cost:
    """One answer's cost event: budgeted in queries (max_queries) by the mechanism's own
    curve, not in mu^2. One answer alone is worth T_max tokens. The proven mode's epsilon is
    the exact optimal composition of its per-token bound; the paper's is nominal, with no
    exact value."""
    one = mozo_spent_epsilon(cal, 1)
    return Cost(
        epsilon=one,
        delta=cal.delta,
        epsilon_exact=one if cal.proven else None,
        mu2=0.0,
        epsilon_total=cal.epsilon,
        curve=partial(mozo_spent_epsilon, cal),
    )
