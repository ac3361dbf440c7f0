"""ESA's pinned designs (mechanisms.esa.build): structure, the closed-form release rates
against a simulation of the server's own release rule, and the INCONCLUSIVE path of a model
whose zero-shot candidates never (or always) give the signal texts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpicl.mechanisms.esa.release import esa_release  # the server's rule, to check the closed form
from dpicl_audit.claims import SettingClaims
from dpicl_audit.datasets import load_dataset
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.esa.audit import EsaAudit
from dpicl_audit.mechanisms.esa.build import (
    build_generation_design,
    esa_design_gaps,
    esa_release_rates,
)
from dpicl_audit.mechanisms.esa.estimates import esa_claims
from dpicl_audit.mechanisms.esa.exact import esa_epsilon_exact
from dpicl_audit.mechanisms.gaussian import GaussianFacts
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import TrialRecord


def _plan(**kw: Any) -> AuditPlan:
    return AuditPlan.from_sources(None, {"mechanism.name": "esa", "seed": 1} | kw)


@pytest.mark.parametrize("layout", ["pivotal", "identical"])
@pytest.mark.parametrize("t", [2, 3, 4, 5])
def test_pinned_designs_differ_in_one_exemplar_and_pin_the_others(layout: str, t: int) -> None:
    plan = _plan(design=layout, **{"mechanism.partitions": t})
    d = build_generation_design(plan, load_dataset(plan.dataset))
    assert d.layout == layout and len(d.exemplars_c0) == t  # one exemplar per partition
    diff = [i for i, (a, b) in enumerate(zip(d.exemplars_c0, d.exemplars_c1, strict=True))
            if a != b]  # fmt: skip
    assert diff == [d.position]

    def answers_y1(e: Any) -> bool:  # the design's intent: Prompt 3 or the copied output
        return e.input == d.canary.input and (layout == "pivotal" or e.output == d.y1)

    a1 = sum(map(answers_y1, d.exemplars_c1))
    a0 = sum(map(answers_y1, d.exemplars_c0))
    g1, g0 = esa_design_gaps(layout, t)
    assert (2 * a1 - t, 2 * a0 - t) == (g1, g0) and g1 == g0 + 2
    if layout == "identical":
        assert d.query == d.canary.input and d.y1 in d.template and d.y0 in d.template
        assert d.decide_text(f"{d.y1}\nInput: more") == 1 and d.decide_text(d.y0) == 0
    else:
        assert d.canary.input in d.query


def test_release_rates_match_the_servers_nearest_candidate_rule() -> None:
    """P(y1) = 2^-Tc + (1 - 2^(1-Tc)) Phi(g D / (2 T sigma)), simulated with the server's
    ``esa_release`` on random unit embeddings in 16 dimensions, fair-coin candidates.
    20,000 draws per gap; the assertion is a two-sided binomial test at p > 1e-4 per gap
    (false-failure rate under 1e-3 for the 6 gaps)."""
    rng = np.random.default_rng(7)
    e = rng.normal(size=(2, 16))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    d = float(np.linalg.norm(e[0] - e[1]))
    t, sigma, tc, n = 5, 0.15, 3, 20_000
    for g in (-5, -3, -1, 1, 3, 5):
        a = (t + g) // 2
        parts = np.array([e[0]] * a + [e[1]] * (t - a))
        hits = 0
        for _ in range(n):
            cand = e[rng.integers(0, 2, size=tc)]
            rel = esa_release(parts, cand, sigma, rng)
            hits += bool(np.allclose(cand[rel.index], e[0]))
        (p, _) = esa_release_rates((g, g), d, t, sigma, tc)
        assert stats.binomtest(hits, n, p).pvalue > 1e-4, (g, hits / n, p)
    # Balanced, both texts present: mu = D / (T sigma), the canary's actual shift.
    p1, p0 = esa_release_rates(esa_design_gaps("pivotal", t), d, t, sigma)
    assert stats.norm.ppf(p1) - stats.norm.ppf(p0) == pytest.approx(d / (t * sigma))


def _estimate(
    texts1: list[str | bool], texts0: list[str | bool], *, shuffle: bool = True
) -> dict[str, Any]:
    """Estimate real trials whose released texts are given (True: y1, False: y0), in a
    random order (an honest server's; ``shuffle=False``: in the order given)."""
    plan = _plan(**{"mechanism.partitions": 3, "mechanism.epsilons": [8.0]})
    d = build_generation_design(plan, load_dataset(plan.dataset))
    rng = np.random.default_rng(0)
    e1, e0 = rng.normal(size=(2, 8))
    d = d.with_embeddings(e1 / np.linalg.norm(e1), e0 / np.linalg.norm(e0), "local")
    sigma = (2 / 3) * math.sqrt(2 * math.log(1.25 / 1e-5)) / 8.0
    gaussian = SettingClaims(
        setting="eps=8", epsilon_theory=8.0, delta=1e-5, sigma=sigma,
        facts=GaussianFacts(3, "classical", d.layout),
    )  # fmt: skip
    claims = esa_claims(plan, d, gaussian)
    assert claims.epsilon_exact == pytest.approx(esa_epsilon_exact(sigma, 2 / 3, 1e-5))

    def text(x: str | bool) -> str:
        return x if isinstance(x, str) else (d.y1 if x else d.y0)

    rows = [
        TrialRecord(
            "eps=8", i, w, f"c{w}", "q", {"text": text(x)}, d.decide_text(text(x)), 0.0, 8.0
        )
        for w, texts in ((1, texts1), (0, texts0))
        for i, x in enumerate(rng.permutation(np.array(texts, dtype=object)) if shuffle else texts)
    ]
    return EsaAudit().estimate(SettingRows(plan, d, 0, rows, claims, False)).to_json()


def test_a_model_without_signal_candidates_is_inconclusive_never_consistent() -> None:
    # 2,000 trials whose released text is never y1 or y0 (a real model's zero-shot
    # candidates, bench/esa_flip_rates.py: 0 of 8 were): no power at all.
    garbage = _estimate(["Ltd erecte pindetjin"] * 1000, ["Mujerli rahyan"] * 1000)
    # (the design's rates need the signal distance: here of two random unit vectors)
    bb = garbage["black_box"]
    assert garbage["signal_release_weight"] < 0.01
    assert bb["verdict"]["status"] == "inconclusive", bb["verdict"]
    assert bb["verdict"]["max_reachable"] < 0.05
    # Greedy candidates: y1 is released in both worlds, every time (TPR = FPR = 1).
    greedy = _estimate([True] * 1000, [True] * 1000)
    assert greedy["black_box"]["verdict"]["status"] == "inconclusive"
    # The same number of trials released as the design says (rates 0.718 / 0.282): power.
    good = _estimate([True] * 718 + [False] * 282, [True] * 282 + [False] * 718)
    assert good["signal_release_weight"] == 1.0
    assert good["black_box"]["verdict"]["status"] == "ok", good["black_box"]["verdict"]
    # The same answers released in runs (all y1, then all y0): their order is not random.
    runs = _estimate([True] * 718 + [False] * 282, [True] * 282 + [False] * 718, shuffle=False)
    assert runs["conformance"]["differs"] == ["independence"], runs["conformance"]
    assert runs["black_box"]["verdict"]["status"] == "nonconforming"
