"""Issue 14's tightness criteria for black-box audits of voting, against a real oracle server.

The pivotal canary design (the other T - 1 partitions pinned so that the canary's partition
decides the released label) makes the black-box release as informative as the votes: its
GDP figure estimates mu = sqrt(2) / sigma, the mechanism's own (docs/auditing.md, "Designs").

* Bootstrap, black-box, T = 4, 8, 16 at epsilon 1, 2, 4, 8 (n_llm = 4 clean vote vectors per
  world: the oracle's votes are deterministic; 400,000 simulated trials per world):
  epsilon_emp >= 0.9 x epsilon_exact and <= epsilon_exact. The largest sampling loss is at
  epsilon 1 (both rates near 1/2): the one-sided 97.5% Clopper-Pearson upper bounds cost about
  0.0045 in mu, 4% of mu = 0.117, so the 0.9 margin fails only on a > 5 sigma deviation.
  An honest server's setting reads ok, or (both measured over 60 runs of the test's 12
  settings, 2 and 1 of 720) INCONCLUSIVE because its figure alone lies just above the exact
  epsilon (the design is that tight; the family-wise figures must not), or NONCONFORMING by
  a conformance test's own false alarm (each at error 6.25e-5; at most one setting a run).
* Real queries, black-box (DPICL_WHITEBOX=off), epsilon 4, T = 8, 4,000 trials. Expected
  counts: TPR = Phi(2 / (sigma sqrt 2)) = 0.795, FPR = 1/2 at sigma = 1.713. Simulated over
  2,000 repetitions of the counts (estimate_from_counts, 2,000 trials per world):
  epsilon_emp / epsilon_exact has mean 0.840 and standard deviation 0.056; it falls below
  0.75 in 5.0% of runs and below 0.6 in none (0.6 is 4.3 standard deviations down: the
  false-failure rate of this test's 0.6 bound is about 1e-5). Issue 14's 0.75 criterion
  therefore holds in about 95% of 4,000-trial runs; the binomial noise of 4,000 trials, not
  the design, sets that (the balanced design already puts the rates where the intervals are
  narrowest).
* The paper's [1, T-1] design stays selectable and is as weak as issue 14 measured (T = 8,
  epsilon 8: its release rates make the reachable bound tiny, reported INCONCLUSIVE).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
from tests.servers import oracle_server_env, target_plan

pytestmark = pytest.mark.slow

EPSILONS = [1.0, 2.0, 4.0, 8.0]


@pytest.mark.long
def test_black_box_bootstrap_is_tight_with_the_pivotal_canary(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(oracle_server_env(tmp_path, "internal"))
    rows = []
    for t in (4, 8, 16):
        plan = target_plan(
            srv.url,
            **{
                "mechanism.epsilons": EPSILONS,
                "mechanism.partitions": t,
                "bootstrap.n_llm": 4,
                "bootstrap.n_sample": 400_000,
                "seed": t,
            },
        )
        out = tmp_path / f"t{t}"
        results = asyncio.run(
            bootstrap_audit(plan, db=out / "audit.db", out_dir=out, progress=False)
        )
        assert results["design"]["design"] == "pivotal"
        for s in results["settings"]:
            assert s["flip_rate"] == 1.0
            rows.append((t, s, _honest_reading(s)))
    print("\n".join(f"T={t} eps={s['epsilon_theory']:g}: {why}" for t, s, why in rows))
    for t, s, why in rows:
        emp, exact = s["black_box"]["epsilon_lower"], s["epsilon_exact"]
        assert 0.9 * exact <= emp, (t, s["epsilon_theory"], emp, exact)
        if why != "above alone":
            assert emp <= exact, (t, s["epsilon_theory"], emp, exact)
    # Each setting's conformance tests read NONCONFORMING on an honest server with
    # probability at most 4 x 6.25e-5 (their error each): two of twelve at most ~4e-6.
    assert sum(why == "false alarm" for _, _, why in rows) <= 1, rows


def _honest_reading(s: dict[str, Any]) -> str:
    """What an honest server's setting may read, and why (the module docstring's rates).

    * ``ok``;
    * ``above alone``: INCONCLUSIVE because this figure alone, at 95%, lies above the exact
      epsilon but not the run's tests together (estimators.family): the pivotal design is
      so tight that a correct server shows it (measured: 2 settings of 720, 60 runs); the
      figures with every test's error divided by the run's size must stay below;
    * ``false alarm``: NONCONFORMING by the white-box noise-scale test alone, from two
      residuals a coordinate (n_llm 4), each test at error 6.25e-5.
    """
    bb = s["black_box"]
    verdict = bb["verdict"]
    if verdict["status"] == "ok":
        return "ok"
    if verdict["status"] == "inconclusive":
        assert verdict["message"].startswith("INCONCLUSIVE: this figure alone reads BUG"), verdict
        mu_exact = math.sqrt(2) / s["sigma"]  # the votes' L2 sensitivity over the noise
        assert verdict["family_wise"]["mu_lower"] <= mu_exact, (mu_exact, verdict)
        return "above alone"
    conformance = s["conformance"]
    assert verdict["status"] == "nonconforming", verdict
    assert conformance["black_box"]["differs"] == [], conformance
    assert conformance["white_box"]["differs"] == ["noise scale"], conformance
    return "false alarm"


@pytest.mark.long
def test_real_query_black_box_audit_is_tight_at_epsilon_4(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(oracle_server_env(tmp_path, "off"))
    plan = target_plan(
        srv.url,
        **{"mechanism.epsilons": [4.0], "mechanism.partitions": 8, "trials": 4000, "seed": 3},
    )
    results = asyncio.run(
        run_audit(plan, db=tmp_path / "audit.db", out_dir=tmp_path, progress=False)
    )
    (s,) = results["settings"]
    bb = s["black_box"]
    print(f"T=8 eps=4 real queries: emp {bb['epsilon_lower']:.3f} exact {s['epsilon_exact']:.3f}")
    assert s["design"] == "pivotal" and s["trials"] == 4000
    assert s["white_box"] is None
    assert 0.6 * s["epsilon_exact"] <= bb["epsilon_lower"] <= s["epsilon_exact"]
    # The classical bound holds at its 95% confidence, so it may cross the release's own
    # exact epsilon in a few % of runs (one CI run: 0.8962 against 0.8940); the ESA design's
    # 4,000 simulated repetitions never reached 1.2x (test_esa_pivotal_oracle.py).
    assert bb["epsilon_lower_classic"] <= 1.2 * s["epsilon_exact_release"]
    assert bb["verdict"]["status"] == "ok", bb["verdict"]


def test_paper_design_stays_selectable_and_says_it_is_weak(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(oracle_server_env(tmp_path, "internal"))
    plan = target_plan(
        srv.url,
        **{
            "design": "paper",
            "mechanism.epsilons": [8.0],
            "mechanism.partitions": 8,
            "bootstrap.n_llm": 4,
            "bootstrap.n_sample": 100_000,
        },
    )
    results = asyncio.run(
        bootstrap_audit(plan, db=tmp_path / "a.db", out_dir=tmp_path, progress=False)
    )
    (s,) = results["settings"]
    assert s["design"] == "paper"
    bb = s["black_box"]
    # [1, 7] against [0, 8] at sigma ~0.86: the label is "No" in both worlds nearly always.
    assert bb["epsilon_lower"] < 0.1 * s["epsilon_exact"]
    assert bb["verdict"]["status"] == "inconclusive", bb["verdict"]
    assert "could reach" in bb["verdict"]["message"]
