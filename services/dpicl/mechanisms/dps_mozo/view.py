"""What ``/v1/debug/generate`` shows of a DPS-MOZO answer: per token the public top-k, the
mixing weights and the per-shot log-ratios (divergences in the paper's mode), the bounds
they are held to; at ``internal`` also the sampled shots, the distributions and the exact
per-shot values."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from dpicl.mechanisms.dps_mozo.accounting import MozoCalibration
from dpicl.mechanisms.dps_mozo.pipeline import MozoOutcome, MozoToken


class MozoTokenInfo(BaseModel):
    """One DPS-MOZO token's internals (``/v1/debug/generate``)."""

    token_id: int = Field(description="The released token id.")
    top_ids: list[int] = Field(description="The zero-shot top-k token ids (public).")
    lambdas: list[float] = Field(description="Each sampled shot's mixing weight.")
    log_ratios: list[float] = Field(
        description="Per shot max_y |log mixed(y) - log zero(y)| on top_ids "
        "(<= max_log_ratio in the proven mode)."
    )
    divergences: list[list[float]] | None = Field(
        default=None,
        description="paper mode: per shot [D_alpha(mixed||zero), D_alpha(zero||mixed)] "
        "reached (<= beta*alpha).",
    )
    shots: list[int] | None = Field(default=None, description="internal: sampled exemplars.")
    mixed_probs: list[list[float]] | None = Field(
        default=None, description="internal: each shot's mixed distribution over top_ids."
    )
    zero_shot_probs: list[float] | None = Field(
        default=None, description="internal: the zero-shot distribution over top_ids."
    )
    product_probs: list[float] | None = Field(
        default=None, description="internal: the released distribution over top_ids."
    )
    exact_divergences: list[list[float]] | None = Field(
        default=None,
        description="internal, paper mode: per shot [D(P||P_i), D(P_i||P)] at alpha, P the "
        "released product and P_i the product with that shot replaced by the zero-shot "
        "distribution.",
    )
    exact_log_ratios: list[float] | None = Field(
        default=None,
        description="internal: per shot max_y |log P(y) - log P_i(y)| (P, P_i as for "
        "exact_divergences); <= 2*max_log_ratio in the proven mode.",
    )

    @classmethod
    def of(cls, t: MozoToken, internal: bool) -> MozoTokenInfo:
        tok = cls(
            token_id=t.token_id,
            top_ids=t.top_ids.tolist(),
            lambdas=t.lambdas.tolist(),
            log_ratios=t.log_ratios.tolist(),
            divergences=None if t.divergences is None else t.divergences.tolist(),
        )
        if not internal:
            return tok
        return tok.model_copy(
            update={
                "shots": t.shots.tolist(),
                "mixed_probs": t.mixed_probs.tolist(),
                "zero_shot_probs": t.zero_probs.tolist(),
                "product_probs": t.product_probs.tolist(),
                "exact_divergences": None if t.exact is None else t.exact.tolist(),
                "exact_log_ratios": None
                if t.exact_log_ratios is None
                else t.exact_log_ratios.tolist(),
            }
        )


class MozoView(BaseModel):
    """DPS-MOZO's white-box fields."""

    guarantee: Literal["proven", "paper"] = Field(
        description="proven (true epsilon) or paper (nominal)."
    )
    max_log_ratio: float | None = Field(
        default=None, description="proven: eps0, each shot's max log-ratio bound."
    )
    per_token_epsilon: float | None = Field(
        default=None, description="proven: pure DP of one token, 4*eps0 (2*eps0 with one shot)."
    )
    alpha: int | None = Field(default=None, description="paper: Renyi order.")
    beta: float | None = Field(default=None, description="paper: target leakage.")
    radius: float = Field(description="Per-shot bound: eps0 (proven) or beta*alpha (paper).")
    per_token_bound: float = Field(
        description="Per-token bound: the max log-ratio per_token_epsilon (proven) or the "
        "nominal RDP 4*beta*alpha of Theorem B.3 (paper).",
    )
    tokens: list[MozoTokenInfo] = Field(description="Per token.")
    max_exact_divergence: float | None = Field(
        default=None, description="internal, paper: the largest exact per-shot divergence seen."
    )
    max_exact_log_ratio: float | None = Field(
        default=None, description="internal: the largest exact per-shot log-ratio seen."
    )


def mozo_view(out: MozoOutcome, cal: MozoCalibration, internal: bool) -> MozoView:
    """The view of one answer of a context calibrated as ``cal``."""
    tokens = [MozoTokenInfo.of(t, internal) for t in out.tokens]
    if cal.proven:
        eps0 = cal.eps0()
        per_token = cal.per_token_epsilon
        assert per_token is not None, "a proven-mode record stores per_token_epsilon"
        view = MozoView(
            guarantee="proven",
            max_log_ratio=eps0,
            per_token_epsilon=per_token,
            radius=eps0,
            per_token_bound=per_token,
            tokens=tokens,
        )
    else:
        beta, alpha = cal.paper_order()
        view = MozoView(
            guarantee="paper",
            alpha=alpha,
            beta=beta,
            radius=beta * alpha,
            per_token_bound=4.0 * beta * alpha,
            tokens=tokens,
        )
    if not internal:
        return view
    worst_ratio = max(
        (
            float(t.exact_log_ratios.max(initial=0.0))
            for t in out.tokens
            if t.exact_log_ratios is not None
        ),
        default=0.0,
    )
    update: dict[str, float] = {"max_exact_log_ratio": worst_ratio}
    if not cal.proven:
        update["max_exact_divergence"] = max(
            (float(t.exact.max(initial=0.0)) for t in out.tokens if t.exact is not None),
            default=0.0,
        )
    return view.model_copy(update=update)
