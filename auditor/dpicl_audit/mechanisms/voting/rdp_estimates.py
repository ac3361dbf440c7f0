"""The RDP audit of one epsilon of a paper-003 adversary run (see :mod:`.voting_rdp`).

Per distinct query of the sequence (identical repeated queries pool their trials):

* ``two_cut`` / ``k_cut``: lower bounds from the *released labels* of the real trials
  (:func:`~dpicl_audit.estimators.rdp_audit.two_cut_from_labels`,
  :func:`~dpicl_audit.estimators.rdp_audit.k_cut_lower`); they measure the server's actual
  noise, so a server adding less noise than it reports shows up here.
* with white-box ``internal`` (clean votes logged): ``exact``, the exact RDP of the noisy
  argmax between the query's clean histograms in the two worlds at the reported sigma, and
  ``two_cut_simulated`` / ``k_cut_simulated``, the same bounds from ``bootstrap.n_sample``
  simulated noisy argmaxes per world of those histograms (the paper's Monte-Carlo audit);
  the 2-cut's output set is the label chosen from the clean histograms, never from samples.
* ``theory``: the Gaussian mechanism's RDP at the reported sigma, Delta2 = sqrt(2).

Composition over the N queries is the order-wise sum, each distinct query counted as often
as it is asked. The per-query intervals are Bonferroni-shared over the distinct queries, so
a composed lower bound holds at the plan's confidence. The (epsilon, delta) figures use
Theorem 1 of 003, an upper-bound conversion: for the lower bounds it is illustrative only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.rdp import rdp_to_epsilon
from dpicl_audit.estimators.rdp_audit import (
    DEFAULT_ORDERS,
    best_output_label,
    exact_rdp,
    gaussian_rdp,
    k_cut_lower,
    simulate_label_counts,
    two_cut_from_labels,
)
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.mechanisms.voting.rdp import RdpDesign
from dpicl_audit.plan import AuditPlan
from dpicl_audit.results import RdpAudit
from dpicl_audit.store import TrialRecord
from dpicl_audit.verdicts import (
    RDP_CUTS,
    Family,
    Status,
    Verdict,
    claim_for_the_family,
    family_of,
    rdp_verdict,
)

__all__ = ["estimate_rdp"]

_STREAM_SIM = 0x0D_3A10
_CURVES = ("two_cut", "k_cut", "two_cut_simulated", "k_cut_simulated", "exact")


def _clean_hist(rows: Sequence[TrialRecord], design: RdpDesign) -> tuple[float, ...] | None:
    """The most frequent clean histogram of a world's trials (one at temperature 0)."""
    vectors = [
        tuple(design.clean_vector(r.observation["clean_votes"]))
        for r in rows
        if "clean_votes" in r.observation
    ]
    return Counter(vectors).most_common(1)[0][0] if vectors else None


def _label_counts(rows: Sequence[TrialRecord], labels: tuple[str, ...]) -> np.ndarray:
    idx = {lab: i for i, lab in enumerate(labels)}
    out = np.zeros(len(labels), dtype=np.int64)
    for r in rows:
        lab = str(r.observation.get("label"))
        if lab in idx:
            out[idx[lab]] += 1
    return out


def _per_query(
    plan: AuditPlan,
    design: RdpDesign,
    rows: Sequence[TrialRecord],
    sigma: float | None,
    confidence: float,
    rng: np.random.Generator,
) -> JsonObject:
    orders = np.asarray(DEFAULT_ORDERS)
    w1 = [r for r in rows if r.world == 1]
    w0 = [r for r in rows if r.world == 0]
    c1, c0 = _label_counts(w1, design.labels), _label_counts(w0, design.labels)
    h1, h0 = _clean_hist(w1, design), _clean_hist(w0, design)
    out: dict[str, Any] = {"label_counts": {"C1": c1.tolist(), "C0": c0.tolist()}}
    output = design.labels.index(design.poison_label)
    if h1 is not None and h0 is not None and sigma is not None:
        output = best_output_label(h1, h0, sigma, 8.0)
        out |= {"h1": list(h1), "h0": list(h0)}
        out["exact"] = exact_rdp(h1, h0, sigma, orders)[0].tolist()
        n = plan.bootstrap.n_sample
        s1 = simulate_label_counts(h1, sigma, n, rng)
        s0 = simulate_label_counts(h0, sigma, n, rng)
        out["two_cut_simulated"] = two_cut_from_labels(
            s1, s0, output, orders, confidence=confidence
        ).tolist()
        out["k_cut_simulated"] = k_cut_lower(s1, s0, orders, confidence=confidence).tolist()
    out["output_label"] = design.labels[output]
    if c1.sum() and c0.sum():
        out |= _released_cuts(c1, c0, output, orders, confidence)
    return out


def _released_cuts(
    c1: np.ndarray, c0: np.ndarray, output: int, orders: np.ndarray, confidence: float
) -> dict[str, list[float]]:
    """One query's lower bounds from its released label counts, at ``confidence``."""
    return {
        "two_cut": two_cut_from_labels(c1, c0, output, orders, confidence=confidence).tolist(),
        "k_cut": k_cut_lower(c1, c0, orders, confidence=confidence).tolist(),
    }


def _composed(per_query: Sequence[Mapping[str, Any]], key: str) -> list[float] | None:
    """The order-wise sum over the sequence, each distinct query as often as it is asked."""
    if not all(key in p for p in per_query):
        return None
    total: list[float] = np.sum(
        [p["multiplicity"] * np.asarray(p[key]) for p in per_query], axis=0
    ).tolist()
    return total


def _for_the_family(
    rdp: dict[str, Any],
    alone: Verdict,
    per_query: Sequence[Mapping[str, Any]],
    design: RdpDesign,
    family: Family,
) -> Verdict:
    """The verdict as the run may state it (verdicts.claim_for_the_family): both cuts
    recomposed from every query's logged label counts with its intervals at error
    ``(1 - c) / (G m)``, G the distinct queries and m the run's tests."""
    orders = np.asarray(rdp["orders"])
    strict = 1.0 - (1.0 - family.confidence) / (len(per_query) * family.size)
    again = [
        dict(p)
        | _released_cuts(
            np.asarray(p["label_counts"]["C1"]),
            np.asarray(p["label_counts"]["C0"]),
            design.labels.index(p["output_label"]),
            orders,
            strict,
        )
        for p in per_query  # a flagged cut is composed from every query's counts
    ]
    cuts = {key: _composed(again, key) for key in RDP_CUTS}
    together = rdp_verdict(orders, rdp | cuts)
    shown = f"both cuts recomposed with each query's intervals at confidence {strict:.6g}"
    out = claim_for_the_family(alone, together, family, shown)
    return replace(
        out, family_wise={"size": family.size, "confidence": strict} | cuts, together=True
    )


def estimate_rdp(
    plan: AuditPlan, design: RdpDesign, rows: Sequence[TrialRecord], claims: SettingClaims
) -> RdpAudit:
    """The ``rdp`` block of one epsilon (per query and composed), its epsilons, verdict."""
    orders = np.asarray(DEFAULT_ORDERS)
    sigma = claims.sigma
    multiplicity = Counter(design.queries)
    groups: dict[str, list[TrialRecord]] = {q: [] for q in multiplicity}
    for r in rows:
        groups.setdefault(r.query, []).append(r)
    # Every distinct query's intervals at 1 - (1 - c)/G: the composed bound holds at c.
    conf = 1.0 - (1.0 - plan.confidence) / len(multiplicity)
    rng = np.random.default_rng([plan.seed, _STREAM_SIM, int(1000 * claims.epsilon_theory)])
    per_query = []
    for q, m in multiplicity.items():
        one = _per_query(plan, design, groups[q], sigma, conf, rng)
        per_query.append({"query": q[:200], "multiplicity": m, **one})
    rdp: dict[str, Any] = {"orders": orders.tolist(), "queries": len(design.queries)}
    for key in _CURVES:
        rdp[key] = _composed(per_query, key)
    rdp["theory"] = (len(design.queries) * gaussian_rdp(orders, sigma)).tolist() if sigma else None
    rdp["per_query"] = per_query
    rdp["confidence"] = plan.confidence
    delta = plan.mechanism.delta
    eps: dict[str, Any] = {
        "delta": delta,
        "note": "Theorem 1 of paper 003 (an upper-bound conversion); for the audit bounds "
        "the figure is illustrative, not a lower bound on epsilon",
    }
    for key in (*_CURVES, "theory"):
        eps[key] = rdp_to_epsilon(orders, rdp[key], delta) if rdp[key] is not None else None
    rdp["epsilons"] = eps
    try:
        found = rdp_verdict(orders, rdp)
        family = family_of(claims)
        if family is not None and found.flags:
            found = _for_the_family(rdp, found, per_query, design, family)
    except InvalidAuditInput as exc:
        found = Verdict(status=Status.ERROR, message=str(exc))
    return RdpAudit.of(**rdp, verdict=found)
