"""Generation (ESA) auditing against the real server app: oracle engine, REAL embedder.

The app runs in-process over httpx.ASGITransport (as in test_runner.py) with the bundled
all-MiniLM-L6-v2, so e(y1), e(y0) and the partition means are real sentence embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.mechanisms.esa.build import build_generation_design
from dpicl_audit.mechanisms.esa.design import SIGNAL_PAIRS, esa_score
from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.report import write_report
from tests.auditor.test_runner import _server_missing, oracle_server
from tests.conftest import ADMIN, USER

pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


def _plan(**overrides: Any) -> AuditPlan:
    base: dict[str, Any] = {
        "target.base_url": "http://dpicl.test",
        "target.admin_token": ADMIN,
        "target.api_key": USER,
        "seed": 3,
        "mechanism.name": "esa",
        "mechanism.partitions": 4,
        "mechanism.shots": 2,
        "batch_size": 50,
    }
    return AuditPlan.from_sources(None, base | overrides)


def test_plan_and_design() -> None:
    plan = _plan()
    assert plan.dataset == "dialogsum-mini"
    design = build_generation_design(plan, load_dataset(plan.dataset))
    assert (design.y1, design.y0) == SIGNAL_PAIRS["clock-foxborough"]
    assert design.canary.input in design.query
    assert design.exemplars_c1[design.position] == design.canary
    assert sum(a != b for a, b in zip(design.exemplars_c0, design.exemplars_c1, strict=True)) == 1
    assert design.decide_text(design.y1) == 1 and design.decide_text(design.y0) == 0
    own = _plan(**{"generation.y1": "Alpha beta gamma.", "generation.y0": "Delta epsilon."})
    assert build_generation_design(own, load_dataset(own.dataset)).signal == "custom"
    with pytest.raises(InvalidPlan):
        _plan(**{"generation.signal": "nope"})
    with pytest.raises(InvalidPlan):
        _plan(attack="brainwash")
    with pytest.raises(InvalidPlan):
        _plan(attack="repeat", threat_model="white-box")
    e1, e0 = np.eye(3)[0], np.eye(3)[1]
    assert esa_score(e1, e1, e0) < 0 < esa_score(e0, e1, e0)


@pytest.mark.slow
@pytest.mark.long
async def test_white_box_bootstrap_is_tight(tmp_path: Path) -> None:
    """Against the oracle, bootstrap epsilon_emp reaches 0.9x the exact epsilon of the
    canary's actual shift ||e(y1) - e(y0)||/T and never exceeds it."""
    plan = _plan(
        **{
            "mechanism.epsilons": [1.0, 2.0, 4.0, 8.0],
            "bootstrap.n_llm": 4,  # the oracle is deterministic: clean means do not vary
            "bootstrap.n_sample": 3_000_000,
            "split": 0.25,
        }
    )
    async with oracle_server(tmp_path) as client:
        res = await bootstrap_audit(
            plan, db=f"sqlite:///{tmp_path}/a.db", target=client, out_dir=tmp_path, progress=False
        )
    assert res["design"]["embeddings_source"] == "server"
    dist = res["design"]["signal_distance"]
    assert 0.5 < dist <= 2.0
    for s in res["settings"]:
        assert s["noise_check"]["consistent"]
        assert s["signal_shift"] == pytest.approx(dist / 4)
        assert s["clean_shift"] == pytest.approx(dist / 4, rel=1e-6)
        assert s["epsilon_exact_signal"] < s["epsilon_exact"]
        wb = s["white_box"]
        print(
            f"eps={s['epsilon_theory']:g} exact={s['epsilon_exact']:.3f} "
            f"exact_signal={s['epsilon_exact_signal']:.3f} emp_wb={wb['epsilon_lower']:.3f} "
            f"emp_bb={s['black_box']['epsilon_lower']:.3f} ratio={wb['ratio_to_exact_signal']:.3f}"
        )
        assert wb["verdict"]["status"] == "ok", wb["verdict"]
        assert not wb["exceeds_exact_signal"]
        assert wb["ratio_to_exact_signal"] >= 0.9, (s["epsilon_theory"], wb)
        assert s["black_box"]["verdict"]["status"] == "ok"
    # The report shows the exact epsilon for the actual shift beside the worst-case one.
    html = write_report(res["run_id"], f"sqlite:///{tmp_path}/a.db", tmp_path / "rep").read_text()
    assert "ε exact (shift)" in html
    for s in res["settings"]:
        assert f"{s['epsilon_exact_signal']:.3f}" in html


@pytest.mark.slow
@pytest.mark.long
async def test_black_box_and_white_box_runs(tmp_path: Path) -> None:
    """Real queries with the balanced design: Prompt 3 black-box (decision: released text is
    y1) and Prompt 2 white-box (noisy-mean score); at epsilon 8 with T=2 both see the canary,
    and 120 trials are too few for power: INCONCLUSIVE, decided in expectation."""
    common = {"mechanism.partitions": 2, "mechanism.epsilons": [8.0], "trials": 120}
    async with oracle_server(tmp_path) as client:
        bb = await run_audit(
            _plan(**common),
            db=f"sqlite:///{tmp_path}/b.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
        wb = await run_audit(
            _plan(**common, threat_model="white-box"),
            db=f"sqlite:///{tmp_path}/w.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
    s = bb["settings"][0]
    assert s["design"] == "pivotal"  # auto on a simulator: the balanced design
    assert s["black_box"]["tpr"] > s["black_box"]["fpr"]
    # The verdict is decided in expectation: the reachable bound comes from the design's
    # closed-form release rates (T = 2: C1 [2, 0] -> 0.875, C0 [1, 1] -> 0.5) at 60 trials
    # per world: 1.34 black-box, 1.91 white-box, below 0.5 x epsilon_exact = 3.96, so the
    # audit is INCONCLUSIVE whatever the counts; a violation or bug needs mu_lower above
    # mu_exact = 1.65 while the true mu is D / (T sigma) = 1.17 (0 in 20,000 simulated runs).
    assert s["black_box"]["verdict"]["status"] == "inconclusive", s["black_box"]["verdict"]
    assert "could reach" in s["black_box"]["verdict"]["message"]
    assert s["epsilon_exact_signal"] is not None
    # (scaled by the observed signal-release weight w <= 1, which keeps their ratio)
    p1, p0 = s["release_rates"]
    assert p1 / p0 == pytest.approx(0.875 / 0.5, abs=5e-3) and p1 <= 0.876
    w = wb["settings"][0]
    assert w["white_box"]["verdict"]["status"] == "inconclusive", w["white_box"]["verdict"]
    assert w["white_box"]["tpr"] > w["white_box"]["fpr"]
    assert not w["white_box"]["exceeds_exact_signal"]


@pytest.mark.slow
@pytest.mark.long
async def test_baselines(tmp_path: Path) -> None:
    """Repeat (Prompt 5) and Reference Vector (Prompt 6) run end to end and stay below the
    exact epsilon; the Repeat attack learns nothing from zero-shot candidates."""
    common = {"mechanism.epsilons": [8.0], "trials": 60}
    async with oracle_server(tmp_path) as client:
        rep = await run_audit(
            _plan(**common, attack="repeat"),
            db=f"sqlite:///{tmp_path}/r.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
        ref = await run_audit(
            _plan(**common, attack="reference-vector", threat_model="white-box"),
            db=f"sqlite:///{tmp_path}/v.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
    r = rep["settings"][0]["black_box"]
    # Repeat learns nothing from zero-shot candidates: no power, so INCONCLUSIVE.
    assert r["epsilon_lower"] == 0.0 and r["verdict"]["status"] == "inconclusive"
    assert ref["design"]["signal"] == "list-empty"
    assert ref["design"]["embeddings_source"] == "local"
    v = ref["settings"][0]["white_box"]
    # 30 trials per world cannot reach 0.5 x epsilon_exact (the perfect-separation bound of
    # 30 + 30 trials is below it), so INCONCLUSIVE is the one honest verdict.
    assert v["verdict"]["status"] == "inconclusive", v["verdict"]


@pytest.mark.slow
@pytest.mark.long
async def test_broken_server_without_1_over_t_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positive control: the server aggregates the partition embeddings by their SUM (it
    forgets the 1/T of the mean) while its noise is calibrated for 2/T and it reports the
    configured epsilon. The bootstrap audit must call it a privacy violation."""
    import dpicl.mechanisms.esa.pipeline as esa_pipeline
    from dpicl.mechanisms.esa.release import esa_release as honest

    def broken(part: Any, cand: Any, sigma: float, rng: np.random.Generator) -> Any:
        arr = np.asarray(part, dtype=np.float64)
        return honest(arr * arr.shape[0], cand, sigma, rng)

    monkeypatch.setattr(esa_pipeline, "esa_release", broken)
    plan = _plan(
        **{
            "mechanism.partitions": 8,
            "mechanism.shots": 1,
            "mechanism.epsilons": [1.0],
            "bootstrap.n_llm": 3,
            "bootstrap.n_sample": 200_000,
        }
    )
    async with oracle_server(tmp_path) as client:
        res = await bootstrap_audit(
            plan, db=f"sqlite:///{tmp_path}/x.db", target=client, out_dir=tmp_path, progress=False
        )
    wb = res["settings"][0]["white_box"]
    assert wb["verdict"]["status"] == "violation", wb
    assert wb["epsilon_lower"] > 1.0
