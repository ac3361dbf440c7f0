"""Voting's pinned designs (issue 14): replace-one pairs whose canary partition decides."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from dpicl_audit.claims import SettingClaims
from dpicl_audit.datasets import load_dataset
from dpicl_audit.estimators.label_release import pivotal_design
from dpicl_audit.mechanisms.neighbours import resolve_design
from dpicl_audit.mechanisms.voting.build import build_design
from dpicl_audit.mechanisms.voting.design import design_votes
from dpicl_audit.plan import AuditPlan
from dpicl_audit.prompts import MINIMAL_TEMPLATE
from dpicl_audit.verdicts import gaussian_verdict


def _plan(**kw: object) -> AuditPlan:
    return AuditPlan.from_sources(None, {"seed": 5, **kw})


def _oracle_votes(exemplars: tuple[object, ...], query: str, labels: tuple[str, ...]) -> list[int]:
    """Votes under the oracle's rules, one exemplar per partition: Prompt 1 votes the first
    label when the exemplar's text occurs in the query; a classification prompt votes the
    exemplar's own label (its only, hence most similar, demonstration)."""
    votes = Counter[str]()
    for e in exemplars:
        if labels == ("Yes", "No"):
            votes["Yes" if e.input.strip() in query else "No"] += 1  # type: ignore[attr-defined]
        else:
            votes[e.output] += 1  # type: ignore[attr-defined]
    return [votes[lab] for lab in labels]


@pytest.mark.parametrize("design", ["pivotal", "identical"])
@pytest.mark.parametrize("t", [2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize("canary", ["natural", "random"])
def test_pinned_design_is_replace_one_and_pivotal(design: str, t: int, canary: str) -> None:
    plan = _plan(design=design, canary=canary, **{"mechanism.partitions": t})
    d = build_design(plan, load_dataset("news-mini"))
    assert d.layout == design
    c1, c0 = d.exemplars(1), d.exemplars(0)
    assert len(c1) == len(c0) == t  # one exemplar per partition
    assert [i for i in range(t) if c1[i] != c0[i]] == [d.position]
    want = pivotal_design(t)
    assert _oracle_votes(c1, d.query, d.labels) == list(want.votes_with)
    assert _oracle_votes(c0, d.query, d.labels) == list(want.votes_without)
    assert design_votes(d, t) == (list(want.votes_with), list(want.votes_without))
    assert d.positive == d.labels[0] and d.negative == d.labels[1]
    if design == "identical":
        assert {e.input for e in c1} == {d.query} and d.template == MINIMAL_TEMPLATE
        assert d.labels[0] != d.labels[1] and " " not in d.labels[0]


def test_auto_resolves_by_engine_and_attack() -> None:
    assert resolve_design(_plan(), simulator=True) == "pivotal"
    assert resolve_design(_plan(), simulator=False) == "identical"
    assert resolve_design(_plan(), simulator=None) == "identical"
    assert resolve_design(_plan(design="paper"), simulator=False) == "paper"
    bw = _plan(attack="brainwash", canary="mislabeled")
    assert resolve_design(bw, simulator=True) == "paper"
    assert resolve_design(_plan(setting="deployment"), simulator=True) == "paper"


def test_pinned_designs_refuse_other_attacks_and_a_position_outside() -> None:
    with pytest.raises(ValueError, match="design 'pivotal'"):
        _plan(design="pivotal", attack="brainwash")
    with pytest.raises(ValueError, match="design 'identical'"):
        _plan(design="identical", attack="repeat", **{"mechanism.name": "esa"})
    with pytest.raises(ValueError, match="design 'pivotal'"):
        _plan(design="pivotal", **{"mechanism.name": "dps-mozo"})
    plan = _plan(design="pivotal", **{"mechanism.partitions": 4, "neighbour.position": 5})
    with pytest.raises(Exception, match="outside the pivotal design"):
        build_design(plan, load_dataset("news-mini"))


def _meta(**kw: Any) -> SettingClaims:
    return SettingClaims.from_json(
        {"epsilon_theory": 4.0, "delta": 1e-5, "epsilon_exact": 3.51} | kw
    )


def test_verdicts_say_inconclusive_without_power_and_consistent_with_it() -> None:
    est = {"mu_lower": 0.0, "epsilon_lower_classic": 0.0, "n_pos": 2000, "n_neg": 2000}
    # no clean vote ever changed: nothing could be seen
    v = gaussian_verdict(est, _meta(flip_rate=0.0))
    assert v.status == "inconclusive" and "never differed" in v.message
    assert v.advice
    # the paper's design at epsilon 8 ([1, 7] against [0, 8]): rates deep in the tail
    v = gaussian_verdict(
        est, _meta(release_rates=[2e-4, 1e-6], epsilon_theory=8.0, epsilon_exact=7.91)
    )
    assert v.status == "inconclusive" and "could reach" in v.message
    # the pivotal design at epsilon 4, T = 8: the same zero bound would be a finding
    v = gaussian_verdict(est, _meta(release_rates=[0.80, 0.5]))
    assert v.status == "ok" and v.max_reachable is not None and v.max_reachable > 0.5 * 3.51
    # a GDP figure above the Gaussian claim is a violation
    big = est | {"mu_lower": 3.0, "epsilon_lower_classic": 1.0}
    v = gaussian_verdict(big, _meta(release_rates=[0.80, 0.5]))
    assert v.status == "violation" and "not" in v.message


def test_a_reported_calibration_weaker_than_the_claim_is_a_bug() -> None:
    """Issue 35, item 4: deterministic, beside the statistics. The exact epsilon of the
    reported noise (the auditor's, or the server's own) above the claim is a BUG even where
    the trials found nothing; at (or a rounding below) the claim it is not."""
    from dpicl_audit.verdicts.claims import calibration_departure

    est = {"mu_lower": 0.0, "epsilon_lower_classic": 0.0, "n_pos": 2000, "n_neg": 2000}
    weak = _meta(epsilon_theory=16.0, epsilon_exact=18.9, sigma=0.428, sensitivity=1.414)
    v = gaussian_verdict(est, weak)
    assert v.status == "bug" and "weaker than claimed" in v.message and "18.9" in v.message
    assert "sigma 0.428" in v.message
    server = _meta(epsilon_theory=16.0, epsilon_exact=15.9, epsilon_exact_server=18.9)
    assert "the server's exact epsilon 18.9" in (calibration_departure(server) or "")
    assert gaussian_verdict(est, server).status == "bug"
    for exact in (16.0, 16.0 * (1 + 1e-6), 3.0):
        assert calibration_departure(_meta(epsilon_theory=16.0, epsilon_exact=exact)) is None
    assert calibration_departure(_meta(epsilon_exact=None)) is None
    # a VIOLATION stays a VIOLATION (the stronger finding)
    strong = {"mu_lower": 5.0, "epsilon_lower_classic": 30.0, "n_pos": 2000, "n_neg": 2000}
    assert gaussian_verdict(strong, weak).status == "violation"
