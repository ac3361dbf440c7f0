"""Issue 14's tightness criteria for black-box audits of ESA, against a real oracle server.

The balanced ("pivotal canary") ESA design pins the other T - 1 partitions so that m answer
y1 and m answer y0 (T = 2m + 1): the canary's partition decides which signal text is nearer
the noisy mean, and the black-box release "y1 or y0" is a 1-D Gaussian test along e1 - e0
with mu = D / (T sigma), D = ||e(y1) - e(y0)|| (docs/auditing.md, "ESA: the balanced design").
Its GDP figure therefore estimates epsilon_exact_signal, the exact epsilon of the canary's
actual shift D / T; epsilon_exact (the worst-case shift 2/T) is above it (D = 1.41 < 2 for the
clock/foxborough pair with MiniLM).

* Bootstrap, black-box, T = 3, 4, 5 at epsilon 1, 2, 4, 8 (n_llm = 2: the oracle's partition
  answers are deterministic; 400,000 simulated trials per world): epsilon_emp >= 0.9 x
  epsilon_exact_signal and <= epsilon_exact_signal. As for voting, the largest sampling loss
  is at epsilon 1 (rates near 1/2): the 97.5% Clopper-Pearson bounds cost about 0.0045 in mu,
  3-4% of mu = 0.146 at T = 3, so the 0.9 margin fails only on a many-sigma deviation.
* Real queries, black-box (``DPICL_WHITEBOX=off``), epsilon 8, T = 3, 8 zero-shot candidates
  (each y1 or y0 by the oracle's fair coin), 2,000 trials. Expected rates 0.718 / 0.282
  (mechanisms.esa.build). Over 2,000 simulated repetitions of the counts the ratio
  epsilon_emp / epsilon_exact_signal has mean 0.826, standard deviation 0.057, minimum 0.64;
  the 0.6 bound is 4 standard deviations down (false-failure rate about 4e-5). The bound
  exceeded epsilon_exact_signal in 0.1% of repetitions (the 5% confidence allows it) and
  epsilon_exact in none, so only the latter is asserted. The reachable bound at these rates
  is 4.31 >= 0.5 x epsilon_exact = 3.96, so the verdict is CONSISTENT ("ok"). (4,000 trials:
  mean 0.874, sd 0.041; one run measured 4.728 / 5.225 = 0.905.)
* The paper's design stays selectable and says it is weak (T = 8, epsilon 8: INCONCLUSIVE,
  below 0.4 x epsilon_exact_signal where the balanced design reaches 0.99 x; the bootstrap
  is seeded and the oracle deterministic, so this is a fixed number, 0.21 x).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
from tests.servers import oracle_server_env, target_plan

pytestmark = pytest.mark.slow

EPSILONS = [1.0, 2.0, 4.0, 8.0]


@pytest.mark.long
def test_black_box_bootstrap_is_tight_with_the_balanced_design(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(oracle_server_env(tmp_path, "internal"))
    rows = []
    for t in (3, 4, 5):
        plan = target_plan(
            srv.url,
            **{
                "mechanism.name": "esa",
                "mechanism.epsilons": EPSILONS,
                "mechanism.partitions": t,
                "bootstrap.n_llm": 2,
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
            bb = s["black_box"]
            sig = s["epsilon_exact_signal"]
            rows.append((t, s["epsilon_theory"], bb["epsilon_lower"], sig, s["epsilon_exact"]))
            assert s["flip_rate"] == 1.0
            assert bb["verdict"]["status"] == "ok", bb["verdict"]
    print("\n".join(f"T={t} eps={e:g}: emp {emp:.3f} exact_signal {sig:.3f} exact {x:.3f}"
                    for t, e, emp, sig, x in rows))  # fmt: skip
    for t, eps, emp, sig, exact in rows:
        assert 0.9 * sig <= emp <= sig < exact, (t, eps, emp, sig, exact)


@pytest.mark.long
def test_real_query_black_box_audit_is_tight_at_epsilon_8(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(oracle_server_env(tmp_path, "off"))
    plan = target_plan(
        srv.url,
        **{
            "mechanism.name": "esa",
            "mechanism.epsilons": [8.0],
            "mechanism.partitions": 3,
            "trials": 2000,
            "seed": 3,
        },
    )
    results = asyncio.run(
        run_audit(plan, db=tmp_path / "audit.db", out_dir=tmp_path, progress=False)
    )
    (s,) = results["settings"]
    bb = s["black_box"]
    sig = s["epsilon_exact_signal"]
    print(f"T=3 eps=8 real queries: emp {bb['epsilon_lower']:.3f} exact_signal {sig:.3f} "
          f"exact {s['epsilon_exact']:.3f} tpr {bb['tpr']:.3f} fpr {bb['fpr']:.3f}")  # fmt: skip
    assert s["design"] == "pivotal" and s["trials"] == 2000
    assert s["white_box"] is None
    # The oracle releases y1 and y0 as designed: w < 1 only when an observed fraction falls
    # below its expected 1/2 by more than its 97.5% interval (about 2.5% per text); w < 0.95
    # needs a 4.2-sigma deviation (about 3e-5), and at w = 0.95 the reachable bound is 4.0,
    # still above 0.5 x epsilon_exact = 3.96, so the verdict stays "ok".
    assert s["signal_release_weight"] >= 0.95
    assert 0.6 * sig <= bb["epsilon_lower"] <= s["epsilon_exact"]
    # The classical bound is capped by the release's own exact epsilon (0.935) at its 95%
    # confidence: simulated, it exceeded it in 0.65% of 4,000 repetitions (one real run did:
    # TPR 0.757 against 0.718), 1.11 x at most, never 1.2 x.
    assert bb["epsilon_lower_classic"] <= 1.2 * s["epsilon_exact_release"]
    assert bb["verdict"]["status"] == "ok", bb["verdict"]


@pytest.mark.long
def test_paper_design_stays_selectable_and_says_it_is_weak(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(oracle_server_env(tmp_path, "internal"))
    plan = target_plan(
        srv.url,
        **{
            "mechanism.name": "esa",
            "design": "paper",
            "mechanism.epsilons": [8.0],
            "mechanism.partitions": 8,
            "bootstrap.n_llm": 2,
            "bootstrap.n_sample": 100_000,
        },
    )
    results = asyncio.run(
        bootstrap_audit(plan, db=tmp_path / "a.db", out_dir=tmp_path, progress=False)
    )
    (s,) = results["settings"]
    assert s["design"] == "paper"
    bb = s["black_box"]
    # [1, 7] against [0, 8]: the clean means sit 3D/8 and D/2 on y0's side of the midpoint,
    # 3.5 and 4.7 sigma away: y1 is released with probability 2.3e-4 and 1.5e-6, and even
    # 100,000 simulated trials per world prove little (one run: 1.11 against 5.22).
    assert bb["epsilon_lower"] < 0.4 * s["epsilon_exact_signal"]
    assert bb["verdict"]["status"] == "inconclusive", bb["verdict"]
