"""DPS-MOZO as the server serves it: its settings (the schema fragment of
``POST /v1/contexts``), calibration (eps0 proven, or the paper's beta), its own budget in
queries, cost event (:mod:`.accounting`), pipeline (:mod:`.pipeline`) and white-box view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import Delta, Epsilon, Float, Int, OptionalInt
from dpicl.errors import ConfigurationError
from dpicl.mechanisms.base import (
    Answering,
    Mechanism,
    NewContext,
    Outcome,
    OwnBudget,
    Record,
    settings_from_options,
)
from dpicl.mechanisms.dps_mozo.accounting import MozoCalibration, mozo_cost
from dpicl.mechanisms.dps_mozo.calibration import calibrate_beta
from dpicl.mechanisms.dps_mozo.pipeline import MozoOutcome, run_mozo
from dpicl.mechanisms.dps_mozo.proven import calibrate_max_log_ratio
from dpicl.mechanisms.dps_mozo.routes import router as synthesis_router
from dpicl.mechanisms.dps_mozo.view import MozoView, mozo_view
from dpicl.privacy.ledger import Cost
from dpicl.store.repository import StoredContext


class MozoSettings(BaseModel):
    """DPS-MOZO (paper 004, Algorithm 1): per-token private decoding, budgeted in queries.

    ``epsilon`` and ``delta`` are the guarantee for the whole context: ``queries`` answers of
    at most ``max_tokens`` tokens each, calibrated once, at creation. ``guarantee: "proven"``
    (default) bounds each mixed distribution's max log-ratio to the zero-shot one by eps0,
    which makes the epsilon true (docs/privacy.md); ``"paper"`` is paper 004's Renyi
    constraint at (beta, alpha), whose epsilon is nominal (Theorem B.3 does not hold).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["dps-mozo"] = "dps-mozo"
    epsilon: Epsilon = Field(description="Total epsilon over all `queries` answers.")
    delta: Delta | None = Field(
        default=None, description="Total delta; default 1/|D| (|D| exemplars)."
    )
    guarantee: Literal["proven", "paper"] = Field(
        default="proven",
        description="proven: max-log-ratio constraint, true (epsilon, delta); paper: paper "
        "004's Renyi constraint, nominal epsilon.",
    )
    alpha: OptionalInt = Field(
        default=None,
        ge=2,
        le=1024,
        description="guarantee paper only: Renyi order; default: the smallest whose "
        "RDP-to-DP conversion costs at most epsilon/2 (paper 004, Section 5.1).",
    )
    n_shots: Int = Field(
        default=4, ge=1, le=1024, description="Exemplars sampled per token (<= |D|)."
    )
    top_k: Int = Field(default=100, ge=1, le=1000, description="Zero-shot top-k support.")
    max_tokens: Int = Field(default=48, ge=1, le=1024, description="T_max per answer.")
    queries: Int = Field(ge=1, le=1_000_000, description="Answers the context will give.")
    lambda_max: Float = Field(default=1.5, ge=0.0, le=10.0, description="Upper end of lambda.")

    def resolved_delta(self, n_exemplars: int) -> float:
        return self.delta if self.delta is not None else 1.0 / n_exemplars


def calibrate_mozo(mech: MozoSettings, n_exemplars: int) -> MozoCalibration:
    """For ``queries * max_tokens`` tokens at q = n_shots/|D|: eps0 in the proven mode
    (:mod:`dpicl.mechanisms.dps_mozo.proven`), beta in the paper's (paper 004, Eq. 8)."""
    delta = mech.resolved_delta(n_exemplars)
    settings = mech.model_dump() | {"delta": delta}
    if mech.guarantee == "proven":
        proven = calibrate_max_log_ratio(
            mech.epsilon,
            delta,
            n_shots=mech.n_shots,
            sample_rate=mech.n_shots / n_exemplars,
            tokens=mech.queries * mech.max_tokens,
        )
        return MozoCalibration(
            **settings,
            max_log_ratio=proven.max_log_ratio,
            per_token_epsilon=proven.per_token_epsilon,
            amplified_per_token_epsilon=proven.amplified_epsilon,
            sample_rate=proven.sample_rate,
            tokens=proven.tokens,
        )
    cal = calibrate_beta(
        mech.epsilon,
        delta,
        mech.alpha,
        tokens=mech.queries * mech.max_tokens,
        sample_rate=mech.n_shots / n_exemplars,
    )
    return MozoCalibration(
        **settings | {"alpha": cal.alpha},
        beta=cal.beta,
        radius=cal.radius,
        rdp_epsilon=cal.rdp_epsilon,
        per_token_rdp=cal.per_token_rdp,
        sample_rate=cal.sample_rate,
        tokens=cal.tokens,
    )


#: What each mode's record leaves out: the other mode's derived values (the paper's record
#: stores max_log_ratio and per_token_epsilon, as null).
NOT_STORED = {
    "proven": {"beta", "radius", "rdp_epsilon", "per_token_rdp"},
    "paper": {"amplified_per_token_epsilon"},
}


#: queries (<= 1e6) x max_tokens (<= 1024): the most tokens a DPS-MOZO context can ask for.
MAX_TOKENS = 1_000_000 * 1024


def calibration_report(options: Mapping[str, Any]) -> Record:
    """``dpicl calibrate --mechanism dps-mozo``: eps0 (proven) or beta (paper) for
    ``tokens`` (n_queries x T_max) at ``sample_rate`` (n_shots/|D|), given directly instead
    of a context's queries and exemplars."""
    opts = dict(options)
    tokens, rate = opts.pop("tokens", None), opts.pop("sample_rate", None)
    if tokens is None or rate is None:
        raise ConfigurationError(
            "dps-mozo needs --tokens (n_queries x T_max) and --sample-rate (n_shots/|D|)",
            param="tokens" if tokens is None else "sample_rate",
        )
    # The command line hands its values on as JSON parsed them (a text where it is none).
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS:
        raise ConfigurationError(
            f"--tokens must be an integer in [1, {MAX_TOKENS}], got {tokens!r}", param="tokens"
        )
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 < rate <= 1.0:
        # (the range check is also false for NaN)
        raise ConfigurationError(
            f"--sample-rate must lie in (0, 1], got {rate!r}", param="sample_rate"
        )
    if opts.get("delta") is None:
        raise ConfigurationError("dps-mozo needs --delta (the total delta)", param="delta")
    # queries: a placeholder the settings require; tokens stands for queries x max_tokens.
    mech: MozoSettings = settings_from_options(DPS_MOZO, opts | {"queries": 1})
    assert mech.delta is not None
    out: Record = {"mechanism": DPS_MOZO.name, "epsilon": mech.epsilon, "delta": mech.delta}
    if mech.guarantee == "proven":
        if mech.alpha is not None:
            raise ConfigurationError(
                f"--alpha={mech.alpha} only applies to --guarantee paper", param="alpha"
            )
        proven = asdict(
            calibrate_max_log_ratio(mech.epsilon, mech.delta, mech.n_shots, rate, tokens)
        )
        proven["amplified_per_token_epsilon"] = proven.pop("amplified_epsilon")  # as stored
        return out | {"guarantee": "proven"} | _calibrated(proven)
    paper = asdict(calibrate_beta(mech.epsilon, mech.delta, mech.alpha, tokens, rate))
    return (
        out
        | {"guarantee": "paper (nominal: Theorem B.3 of paper 004 does not hold)"}
        | _calibrated(paper)
    )


def _calibrated(fields: Record) -> Record:
    """A calibration's derived values (its epsilon and delta are the report's own)."""
    return {k: v for k, v in fields.items() if k not in ("epsilon", "delta")}


class Mozo(Mechanism[MozoCalibration]):
    """Per-token private decoding over one-shot distributions mixed with the zero-shot one."""

    name = "dps-mozo"
    task = "generation"
    settings = MozoSettings
    calibration = MozoCalibration
    debug_model = MozoView

    def check(self, settings: Any, new: NewContext) -> None:
        mech: MozoSettings = settings
        n = new.n_exemplars
        if mech.n_shots > n:
            raise ConfigurationError(
                f"n_shots={mech.n_shots} is larger than the number of exemplars ({n})",
                param="mechanism.n_shots",
            )
        if mech.guarantee == "proven" and mech.alpha is not None:
            raise ConfigurationError(
                f"alpha={mech.alpha} only applies to guarantee 'paper'; the proven mode "
                "has no Renyi order",
                param="mechanism.alpha",
            )
        if mech.delta is None and n < 2:
            raise ConfigurationError(
                f"the default delta 1/|D| needs at least 2 exemplars, got {n}; give delta",
                param="mechanism.delta",
            )
        if new.budget is not None:
            raise ConfigurationError(
                "a dps-mozo context is budgeted by mechanism.epsilon over mechanism.queries "
                f"answers; omit budget (got {new.budget!r})",
                param="budget",
            )

    def calibrate(self, settings: Any, n_exemplars: int) -> MozoCalibration:
        return calibrate_mozo(settings, n_exemplars)

    def record(self, calibration: MozoCalibration) -> Record:
        return calibration.model_dump(exclude=NOT_STORED[calibration.guarantee])

    def calibration_report(self, options: Mapping[str, Any]) -> Record:
        return calibration_report(options)

    def own_budget(self, calibration: MozoCalibration) -> OwnBudget | None:
        """The mechanism's own (epsilon, delta) is the context's budget, spent in queries."""
        return OwnBudget(
            epsilon=calibration.epsilon, delta=calibration.delta, max_queries=calibration.queries
        )

    def cost(self, calibration: MozoCalibration) -> Cost:
        return mozo_cost(calibration)

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        return await run_mozo(
            context,
            query,
            engine=how.runtime.engine,
            ledger=how.ledger,
            rng=how.rng,
            max_tokens=how.max_tokens,
            exact=how.exact,
            sink=how.sink,
        )

    def routers(self) -> Sequence[APIRouter]:
        """``POST /v1/contexts/{context_id}/synthesize``: the offline mode (Algorithm 3)."""
        return (synthesis_router,)

    def debug_view(self, outcome: Any, whitebox: str) -> MozoView:
        """Per token: the top-k, lambdas, log-ratios (and divergences in the paper's mode);
        at ``internal`` also the sampled shots, the distributions and the exact values."""
        out: MozoOutcome = outcome
        return mozo_view(out, self.calibration_of(out.context), whitebox == "internal")


DPS_MOZO = Mozo()
