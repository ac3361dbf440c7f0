"""DPS-MOZO's proven mode as the auditor reads it: a true (epsilon, delta) claim.

* The auditor's own recomputation (:mod:`dpicl_audit.mechanisms.dps_mozo.check`) against
  brute-force products of probabilities, and its handling of zeros and of a server that lies
  about its ``log_ratios``.
* Against the real server app in-process (oracle engine: its decoding logits are
  pseudo-random, so every constraint is exercised but the canary has no effect): proven
  black-box and white-box audits are not VIOLATION; the positive control
  (``tests/e2e/broken_mozo_server.py``: eps0 twice as loose as reported, log-ratios clipped)
  is VIOLATION with the trial and token named; the paper mode stays worded nominal.
* With the bundled SmolLM2 (transformers engine, slow): real logits pass the white-box check.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.errors import InvalidPlan, TargetProtocolError
from dpicl_audit.mechanisms.dps_mozo.check import token_check
from dpicl_audit.mechanisms.dps_mozo.facts import MozoFacts
from dpicl_audit.mechanisms.dps_mozo.findings import ratio_check
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import TrialRecord
from tests.auditor.test_runner import _plan, _server_missing
from tests.servers import app_client

needs_server = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


def _mozo(**overrides: Any) -> AuditPlan:
    base: dict[str, Any] = {
        "mechanism.name": "dps-mozo",
        "mechanism.epsilons": [2.0],
        "mechanism.exemplars": 3,
        "trials": 20,
        "batch_size": 10,
    }
    return _plan(**(base | overrides))


# ---------------------------------------------------------------- the recomputation


def _brute(p0: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """Radius and worst |log P/P_i| by direct products of probabilities (no logs until the
    end), for comparison with the log-space recomputation."""
    radius = float(np.max(np.abs(np.log(q) - np.log(p0))))
    prod = np.prod(q, axis=0)
    p = prod / prod.sum()
    worst = 0.0
    for i in range(q.shape[0]):
        pi = p0 * np.prod(np.delete(q, i, axis=0), axis=0)
        pi = pi / pi.sum()
        worst = max(worst, float(np.max(np.abs(np.log(p) - np.log(pi)))))
    return radius, worst


def test_token_check_matches_brute_force() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        k, n = int(rng.integers(2, 30)), int(rng.integers(1, 6))
        p0 = rng.dirichlet(np.ones(k))
        q = p0 * np.exp(rng.normal(0, 0.3, size=(n, k)))
        q /= q.sum(axis=1, keepdims=True)
        prod = np.prod(q, axis=0)
        tok = {
            "zero_shot_probs": p0.tolist(),
            "mixed_probs": q.tolist(),
            "product_probs": (prod / prod.sum()).tolist(),
            "log_ratios": [0.0] * n,
            "exact_log_ratios": [0.5] * n,
        }
        got = token_check(tok)
        radius, worst = _brute(p0, q)
        assert got["radius"] == pytest.approx(radius, rel=1e-9, abs=1e-12)
        assert got["exact"] == pytest.approx(worst, rel=1e-9, abs=1e-12)
        assert got["product_gap"] is not None and got["product_gap"] < 1e-9
        assert got["radius_server"] == 0.0 and got["exact_server"] == 0.5
        # The proof's bounds hold for any such q (docs/privacy.md): 2 radius, 4 radius.
        assert got["exact"] <= 2 * radius * (1 + 1e-9)


def test_token_check_zeros_and_bad_input() -> None:
    # Both 0: nothing to release either way; 0 against > 0: an infinite ratio.
    same = token_check({"zero_shot_probs": [0.5, 0.5, 0.0], "mixed_probs": [[0.6, 0.4, 0.0]]})
    assert same["radius"] == pytest.approx(np.log(1.25))  # 0.5 -> 0.4
    leak = token_check({"zero_shot_probs": [0.5, 0.5, 0.0], "mixed_probs": [[0.5, 0.4, 0.1]]})
    assert leak["radius"] == np.inf
    # Below internal: nothing to recompute.
    assert token_check({"log_ratios": [0.1]})["radius"] is None
    with pytest.raises(TargetProtocolError, match="mixed_probs"):
        token_check({"zero_shot_probs": [0.5, 0.5], "mixed_probs": [[0.2, 0.3, 0.5]]})
    with pytest.raises(TargetProtocolError, match="zero_shot_probs"):
        token_check({"zero_shot_probs": [-0.5, 1.5], "mixed_probs": [[0.5, 0.5]]})


def _row(index: int, tokens: list[dict[str, Any]]) -> TrialRecord:
    obs = {"tokens": [{"token_id": 1} | token_check(t) for t in tokens]}
    return TrialRecord("eps=2", index, index % 2, "ctx", "q", obs, 0, 0.0)


def _ratio_json(rows: list[TrialRecord], meta: dict[str, Any]) -> dict[str, Any]:
    """:func:`ratio_check`'s finding, as the results store it."""
    return ratio_check(rows, MozoFacts.from_json(meta)).to_json()


def test_ratio_check_ignores_the_servers_own_ratios() -> None:
    eps0 = 0.1
    p0 = np.array([0.7, 0.2, 0.1])
    ok_q = p0 * np.exp([0.02, -0.05, 0.05])  # radius about 0.06 after normalising
    bad_q = p0 * np.exp([0.0, 0.25, -0.2])  # radius about 0.22 > eps0
    meta = {"max_log_ratio": eps0, "per_token_epsilon": 4 * eps0}

    def tok(q: np.ndarray) -> dict[str, Any]:
        q = q / q.sum()
        return {"zero_shot_probs": p0.tolist(), "mixed_probs": [q.tolist(), p0.tolist()]}

    honest = _ratio_json([_row(0, [tok(ok_q)]), _row(1, [tok(ok_q), tok(ok_q)])], meta)
    assert honest["verdict"]["status"] == "ok", honest
    assert honest["max_radius"] <= eps0 and honest["tokens"] == 3
    # The lying server reports log_ratios of 0 for the bad token: the recomputation finds it.
    lying = tok(bad_q) | {"log_ratios": [0.0, 0.0], "exact_log_ratios": [0.0, 0.0]}
    bad = _ratio_json([_row(0, [tok(ok_q)]), _row(5, [tok(ok_q), lying])], meta)
    assert bad["verdict"]["status"] == "violation"
    assert "trial 5" in bad["verdict"]["message"] and "token 1" in bad["verdict"]["message"]
    assert bad["max_radius_server"] == 0.0 < eps0 < bad["max_radius"]
    # A server whose reported exact_log_ratios exceed its own per-token claim: VIOLATION too.
    admitted = tok(ok_q) | {"exact_log_ratios": [0.5, 0.0]}
    assert _ratio_json([_row(0, [admitted])], meta)["verdict"]["status"] == "violation"

    # C1 and C0 answers drawn with the same shots: their first released distributions are
    # the replace-one pair itself, bounded by per_token_epsilon.
    def first(probs: list[float], shots: list[int]) -> dict[str, Any]:
        return {"shots": shots, "top_ids": [4, 5, 6], "product_probs": probs}

    near, far = [0.65, 0.25, 0.1], [0.1, 0.3, 0.6]  # far from p0: log 7 = 1.95 > 0.4
    rows = [_row(0, [tok(ok_q)]), _row(1, [tok(ok_q)]), _row(3, [tok(ok_q)])]
    for r, (probs, shots) in zip(
        rows, [(p0.tolist(), [0, 1]), (near, [0, 1]), (far, [0, 2])], strict=True
    ):
        r.observation["first_token"] = first(probs, shots)
    same = _ratio_json(rows, meta)  # trials 0 (C0) and 1 (C1) share shots {0, 1}
    assert same["neighbour_shot_sets"] == 1 and same["verdict"]["status"] == "ok", same
    assert same["max_neighbour_log_ratio"] == pytest.approx(np.log(0.25 / 0.2))
    rows[1].observation["first_token"] = first(far, [0, 1])
    apart = _ratio_json(rows, meta)
    assert apart["verdict"]["status"] == "violation", apart
    assert "trial 1" in apart["verdict"]["message"] and "trial 0" in apart["verdict"]["message"]
    # A released distribution that is not the product of the reported mixed ones.
    wrong = tok(ok_q) | {"product_probs": [0.1, 0.1, 0.8]}
    assert _ratio_json([_row(0, [wrong])], meta)["verdict"]["status"] == "bug"
    # No probabilities (the server at noisy): the auditor could not check.
    blind = _ratio_json([_row(0, [{"log_ratios": [0.05]}])], meta)
    assert blind["verdict"]["status"] == "inconclusive"


def test_plan_guarantee_field() -> None:
    assert _mozo().mechanism.guarantee == "proven"
    assert _mozo(**{"mechanism.guarantee": "paper", "mechanism.alpha": 4}).mechanism.alpha == 4
    with pytest.raises(InvalidPlan, match="alpha"):
        _mozo(**{"mechanism.alpha": 4})
    with pytest.raises(InvalidPlan, match="guarantee"):
        _mozo(**{"mechanism.guarantee": "nominal"})
    # Plans stored before the proven mode existed audited the paper's mode.
    stored = _mozo(**{"mechanism.guarantee": "paper"}).public_dump()
    del stored["mechanism"]["guarantee"]
    stored["mechanism"]["alpha"] = 8
    assert AuditPlan.from_public(stored).mechanism.guarantee == "paper"


# ---------------------------------------------------------------- against the real app


def _server(
    tmp_path: Path, *, engine: str = "oracle", whitebox: str = "internal"
) -> AbstractAsyncContextManager[DpiclClient]:
    db = f"sqlite:///{tmp_path}/server-{engine}-{whitebox}.db"
    return app_client(db, engine=engine, whitebox=whitebox, concurrency=4, request_timeout=300.0)


async def _run(tmp_path: Path, plan: AuditPlan, **server: Any) -> dict[str, Any]:
    async with _server(tmp_path, **server) as client:
        res: dict[str, Any] = await run_audit(
            plan,
            db=f"sqlite:///{tmp_path}/audit.db",
            target=client,
            out_dir=tmp_path / "runs",
            progress=False,
        )
    return res


@needs_server
@pytest.mark.long
async def test_proven_black_box_is_a_true_claim(tmp_path: Path) -> None:
    res = await _run(tmp_path, _mozo(trials=40), whitebox="off")
    s = res["settings"][0]
    assert s["guarantee"] == "proven" and s["nominal"] is False
    assert s["max_log_ratio"] > 0 and s["per_token_bound"] == s["per_token_epsilon"]
    bb = s["black_box"]
    assert bb["epsilon_emp"] == max(bb["epsilon_lower_classic"], 0.0)
    assert bb["verdict"]["status"] != "violation"  # the canary moves nothing on the oracle
    assert "nominal" not in bb["verdict"]["message"]


@needs_server
async def test_proven_white_box_passes_the_token_check(tmp_path: Path) -> None:
    plan = _mozo(threat_model="white-box", **{"mechanism.max_tokens": 3})
    s = (await _run(tmp_path, plan))["settings"][0]
    wb = s["white_box"]
    assert wb["kind"] == "max-log-ratio" and wb["verdict"]["status"] == "ok", wb
    assert wb["tokens"] >= 20 and wb["max_radius"] <= s["max_log_ratio"] * (1 + 1e-9)
    # The constraint binds on the oracle's pseudo-random logits (else the control is empty).
    assert wb["max_radius"] > 0.99 * s["max_log_ratio"]
    assert wb["max_exact_log_ratio"] <= s["per_token_epsilon"]
    assert wb["max_exact_log_ratio"] == pytest.approx(wb["max_exact_log_ratio_server"], rel=1e-6)
    # n_shots = |D|: every first token is drawn with all shots, in C1 and in C0 alike.
    assert wb["neighbour_shot_sets"] == 1
    assert 0 < wb["max_neighbour_log_ratio"] <= s["per_token_epsilon"]
    assert s["black_box"]["verdict"]["status"] != "violation"
    # Each released first token was drawn from the distribution reported for it.
    conf = s["conformance"]["white_box"]
    assert s["conformance"]["status"] == "conforming", s["conformance"]
    assert [t["what"] for t in conf["tests"]] == ["sampling", "sampling"]
    assert conf["tests"][0]["df"] == 20


@needs_server
async def test_a_greedy_server_is_nonconforming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A realistic bug: the server reports the DP product distribution but releases its
    # argmax (greedy decoding left on). Every bound stays below the claim; the released
    # tokens are not draws from what is reported. The oracle's products are peaked (the
    # mode is drawn about 91% of the time), so it takes 200 trials: the count of released
    # modes then has p about 2e-8 against the conformance test's error of 1e-3.
    import dpicl.mechanisms.dps_mozo.release as mozo_release

    monkeypatch.setattr(mozo_release, "sample_token", lambda probs, rng: int(np.argmax(probs)))
    plan = _mozo(threat_model="white-box", trials=200, **{"mechanism.max_tokens": 1})
    s = (await _run(tmp_path, plan))["settings"][0]
    assert s["conformance"]["status"] == "nonconforming", s["conformance"]
    assert s["conformance"]["differs"] == ["sampling"]
    assert s["white_box"]["verdict"]["status"] == "nonconforming", s["white_box"]["verdict"]


@needs_server
async def test_broken_server_is_flagged_by_the_white_box_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dpicl.mechanisms.dps_mozo.pipeline as mozo_pipeline
    from tests.e2e.broken_mozo_server import broken_mozo_step

    monkeypatch.setattr(mozo_pipeline, "mozo_step", broken_mozo_step)
    plan = _mozo(threat_model="white-box", trials=10, **{"mechanism.max_tokens": 2})
    s = (await _run(tmp_path, plan))["settings"][0]
    wb = s["white_box"]
    assert wb["verdict"]["status"] == "violation", wb
    assert "token" in wb["verdict"]["message"] and "trial" in wb["verdict"]["message"]
    assert wb["max_radius"] > 1.5 * s["max_log_ratio"]
    assert wb["max_radius_server"] <= s["max_log_ratio"]  # the server's own figures hide it


@needs_server
async def test_paper_mode_stays_nominal(tmp_path: Path) -> None:
    plan = _mozo(  # the paper's calibration is infeasible at epsilon 2 with 2 tokens, q = 1
        threat_model="white-box",
        **{"mechanism.guarantee": "paper", "mechanism.epsilons": [8.0]},
    )
    s = (await _run(tmp_path, plan))["settings"][0]
    assert s["guarantee"] == "paper" and s["nominal"] is True
    assert "nominal" in s["black_box"]["verdict"]["message"]
    assert s["white_box"]["kind"] == "divergence"


@needs_server
async def test_a_context_in_the_other_mode_is_refused(tmp_path: Path) -> None:
    async with _server(tmp_path) as client:
        plan = _mozo(**{"mechanism.guarantee": "paper", "mechanism.epsilons": [8.0]})
        from dpicl_audit.mechanisms.dps_mozo.audit import MOZO, _check_guarantee
        from dpicl_audit.store import ContextRecord

        info = {"id": "c", "mechanism": {"name": "dps-mozo", "guarantee": "proven"}}
        with pytest.raises(TargetProtocolError, match="guarantee 'proven'"):
            _check_guarantee(ContextRecord("eps=2", 1, 2.0, "c", info), "paper")
        legacy = {"id": "c", "mechanism": {"name": "dps-mozo"}}  # a server before the mode
        with pytest.raises(TargetProtocolError, match="guarantee 'paper'"):
            _check_guarantee(ContextRecord("eps=2", 1, 2.0, "c", legacy), "proven")
        body = MOZO.context_body(MOZO.build_design(plan, _dataset(plan)), plan, 8.0, 1, name="x")
        assert body["mechanism"]["guarantee"] == "paper"
        created = await client.create_context(body)
        assert created["mechanism"]["guarantee"] == "paper"


def _dataset(plan: AuditPlan) -> Any:
    from dpicl_audit.datasets import load_dataset

    return load_dataset(plan.dataset)


@needs_server
@pytest.mark.slow
@pytest.mark.long
async def test_proven_white_box_on_smollm2(tmp_path: Path) -> None:
    """Real logits of the bundled SmolLM2 (transformers engine): every released token within
    the claimed bounds, recomputed by the auditor."""
    plan = _mozo(
        threat_model="white-box",
        trials=10,
        **{"mechanism.max_tokens": 2, "mechanism.top_k": 50, "mechanism.epsilons": [4.0]},
    )
    s = (await _run(tmp_path, plan, engine="transformers"))["settings"][0]
    wb = s["white_box"]
    assert wb["verdict"]["status"] == "ok", wb
    assert wb["tokens"] >= 10 and wb["max_radius"] <= s["max_log_ratio"] * (1 + 1e-9)
    assert wb["max_exact_log_ratio"] <= s["per_token_epsilon"]
    assert wb["neighbour_shot_sets"] == 1  # the real replace-one pair, at the first token
    assert wb["max_neighbour_log_ratio"] <= s["per_token_epsilon"]
