"""Conformance tests (issue 27): each test against its closed form with seeded draws, and
their verdict (NONCONFORMING never reads CONSISTENT), and the CLI's exit codes.

False-failure rates: the honest draws below are tested at the conformance share of a
run's error (at most 1e-3 for all of a setting's tests together), with fixed seeds; a
fresh seed would fail such a test with probability at most 1e-3.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpicl_audit.claims import Family
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.conformance import (
    CONFORMANCE_ERROR,
    Conformance,
    conformance_alpha,
    rate_tests,
    residual_tests,
)
from dpicl_audit.estimators.noise_check import check_noise
from dpicl_audit.results import RunResult, results_exit_code
from dpicl_audit.verdicts import EXIT_CODES, Status, Verdict, worst_status

SIGMA = 1.7
META = Family(size=5, confidence=0.95, settings=4)


def _conf(tests: list) -> Conformance:  # type: ignore[type-arg]
    return Conformance(conformance_alpha(META, len(tests)), tuple(tests))


def test_alpha_is_the_conformance_share_of_the_family() -> None:
    # min(0.05 / 5, 1e-4) = 1e-4, over 4 settings and 5 tests
    assert CONFORMANCE_ERROR == 1e-4
    assert conformance_alpha(META, 5) == pytest.approx(1e-4 / 4 / 5)
    small = Family(size=1000, confidence=0.95, settings=1)
    assert conformance_alpha(small, 1) == pytest.approx(0.05 / 1000)


def test_release_rates_against_the_closed_form() -> None:
    rates = (0.795, 0.205)
    ok = _conf(rate_tests(160, 200, 40, 200, rates))
    assert ok.status == "conforming"
    # Issue 27's exemplar in two partitions: 1.00 and 0.82 where the design says 0.795/0.205.
    bad = _conf(rate_tests(200, 200, 164, 200, rates))
    assert bad.status == "nonconforming"
    d = bad.to_dict()
    assert d["differs"] == ["release rate"] and "0.795" in d["message"]


def test_honest_gaussian_noise_conforms() -> None:
    rng = np.random.default_rng(27)
    r = rng.normal(0.0, SIGMA, size=(400, 2))
    tests = residual_tests(r, SIGMA, groups=[i % 2 for i in range(400)], names=["Yes", "No"])
    assert {t.what for t in tests} == {"noise scale", "correlation", "tails", "independence"}
    assert _conf(tests).status == "conforming", _conf(tests).to_dict()
    emb = rng.normal(0.0, 0.4, size=(200, 64))
    dirs = rng.standard_normal((4, 64))
    assert _conf(residual_tests(emb, 0.4, directions=dirs)).status == "conforming"


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("small", "noise scale"),
        ("correlated", "correlation"),
        ("uniform", "tails"),
        ("repeated", "determinism"),
        ("sticky", "independence"),
    ],
)
def test_wrong_noise_is_named(name: str, what: str) -> None:
    rng = np.random.default_rng(3)
    n = 400
    if name == "small":
        r = rng.normal(0.0, SIGMA / 1.5, size=(n, 2))
    elif name == "correlated":  # right variance per label, one draw for both
        z = rng.normal(0.0, SIGMA, size=(n, 1))
        r = np.hstack([z, z])
    elif name == "uniform":  # right variance, no tails
        h = SIGMA * math.sqrt(3.0)
        r = rng.uniform(-h, h, size=(n, 2))
    elif name == "repeated":  # 4 distinct answers, each repeated 100 times
        r = np.repeat(rng.normal(0.0, SIGMA, size=(4, 2)), n // 4, axis=0)
    else:  # noise reused for two consecutive answers, slightly jittered
        base = np.repeat(rng.normal(0.0, SIGMA, size=(n // 2, 2)), 2, axis=0)
        r = base + rng.normal(0.0, 0.01, size=base.shape)
    c = _conf(residual_tests(r, SIGMA))
    assert c.status == "nonconforming"
    assert what in c.to_dict()["differs"], c.to_dict()


def test_partial_noise_on_an_embedding_is_seen() -> None:
    rng = np.random.default_rng(5)
    r = rng.normal(0.0, 0.4, size=(100, 64))
    r[:, 32:] = 0.0  # ESA noise on half of the dimensions
    c = _conf(residual_tests(r, 0.4, directions=rng.standard_normal((4, 64))))
    assert c.status == "nonconforming" and "noise scale" in c.to_dict()["differs"]


def test_repeats_count_once_in_the_noise_check() -> None:
    # 4 distinct residual values repeated 100 times are 4 draws, not 400.
    rng = np.random.default_rng(1)
    r = np.repeat(rng.normal(0.0, 1.0, size=4), 100)
    check = check_noise(r, 1.0)
    assert check.n_residuals == 4


def test_bad_residuals_are_refused() -> None:
    with pytest.raises(InvalidAuditInput):
        residual_tests(np.array([[np.nan, 1.0]]), 1.0)
    with pytest.raises(InvalidAuditInput):
        residual_tests(np.zeros((3, 2)), 0.0)


def test_nonconforming_replaces_consistent_and_inconclusive_never_a_violation() -> None:
    bad = _conf(rate_tests(200, 200, 164, 200, (0.795, 0.205))).to_dict()
    for status in ("ok", "inconclusive"):
        got = Verdict(Status(status), "m", violation=False).read_with(bad)
        assert got.status == "nonconforming" and got.message.startswith("NONCONFORMING")
        assert got.to_dict()["verdict"] == "NONCONFORMING"
    kept = Verdict(Status.VIOLATION, "V", violation=True).read_with(bad)
    assert kept.status == "violation" and "NONCONFORMING" in kept.message
    assert worst_status(["ok", "nonconforming", "inconclusive"]) == "nonconforming"
    assert worst_status(["bug", "nonconforming"]) == "bug"


def test_exit_codes_by_worst_verdict() -> None:
    def res(*statuses: str) -> dict[str, object]:
        return {"settings": [{"black_box": {"verdict": {"status": s}}} for s in statuses]}

    for strict in (False, True):
        assert results_exit_code([res("ok", "ok")], strict=strict) == 0
        assert results_exit_code([res("inconclusive", "nonconforming")], strict=strict) == 4
        assert results_exit_code([res("nonconforming"), res("bug")], strict=strict) == 5
        assert results_exit_code([res("violation")], strict=strict) == 5
    # The gate: a figure without power passes by default and fails only under --strict.
    assert results_exit_code([res("ok", "inconclusive")]) == 0
    assert results_exit_code([res("ok", "inconclusive")], strict=True) == 3
    assert len({3, 4, 5} - set(EXIT_CODES.values())) == 0


def test_roc_figures() -> None:
    from dpicl_audit.estimators.roc import roc_from_decisions, roc_from_scores

    rng = np.random.default_rng(9)
    mu = 2.0
    pos, neg = rng.normal(mu, 1.0, 4000), rng.normal(0.0, 1.0, 4000)
    roc = roc_from_scores(pos, neg)
    assert roc is not None
    # AUROC of two unit Gaussians mu apart: Phi(mu / sqrt 2) = 0.921
    assert roc["auroc"] == pytest.approx(0.9214, abs=0.01)
    assert 0.3 < roc["tpr_at_fpr"]["0.01"] < 0.5  # Phi(mu - 2.326) = 0.37
    assert roc["curve"][0] == [0.0, 0.0] and roc["curve"][-1] == [1.0, 1.0]
    assert len(roc["curve"]) <= 101
    point = roc_from_decisions(80, 20, 10, 90)
    assert point is not None and point["auroc"] == pytest.approx(0.85)
    assert point["tpr_at_fpr"]["0.1"] == pytest.approx(0.8)
    assert roc_from_decisions(0, 0, 1, 1) is None


def test_report_sections() -> None:
    from types import SimpleNamespace

    from dpicl_audit.report.ledger_section import conformance_html, ledger_html, roc_html

    bad = _conf(rate_tests(200, 200, 164, 200, (0.795, 0.205))).to_dict()
    results = {
        "settings": [
            {
                "setting": "eps=4",
                "conformance": bad,
                "black_box": {"roc": {"auroc": 0.6, "tpr_at_fpr": {"0.1": 0.2}}},
            }
        ]
    }
    ledger = {
        "status": "nonconforming",
        "message": "reported remaining_queries after 1 answers: 3 (expected 2)",
        "budget": {"epsilon": 1.5, "delta": 1e-5},
        "checks": [{"check": "refuses exactly", "ok": False, "reported": 4, "expected": 3}],
    }
    rd = SimpleNamespace(label="run <1>", results=RunResult.from_json(results), ledger=ledger)
    html = ledger_html([rd]) + conformance_html([rd]) + roc_html([rd])  # type: ignore[list-item]
    assert "<h2>Ledger</h2>" in html and "FAILED" in html and "run &lt;1&gt;" in html
    assert "<h2>Conformance</h2>" in html and "release rate" in html
    assert "<h2>Attack ROC</h2>" in html and "0.600" in html
    quiet = SimpleNamespace(label="r", results=RunResult.from_json({"settings": []}), ledger=None)
    assert ledger_html([quiet]) == conformance_html([quiet]) == roc_html([quiet]) == ""  # type: ignore[list-item]


def test_the_correlation_test_is_exact_for_few_answers() -> None:
    """The sum of products of independent normals against simulation, at m = 1, 2 and 5:
    the p-value is the tail frequency within 6 standard errors of 400,000 draws (false
    failure below 1e-8 per point). The normal approximation gave the honest server's two
    answers p = 1e-6 where the tail is 1e-3."""
    from dpicl_audit.estimators.conformance import product_sum_two_sided

    rng = np.random.default_rng(20261125)
    n = 400_000
    for m in (1, 2, 5):
        sums = np.sum(rng.standard_normal((n, m)) * rng.standard_normal((n, m)), axis=1)
        for s in (0.5, 2.0, 4.0, 6.9):
            freq = float(np.mean(np.abs(sums) >= s))
            p = product_sum_two_sided(s, m)
            se = math.sqrt(max(p * (1 - p), 1e-7) / n)
            assert abs(p - freq) <= 6 * se + 1e-6, (m, s, p, freq)
    assert product_sum_two_sided(-6.914, 2) > 6.25e-5  # the honest case that was flagged
