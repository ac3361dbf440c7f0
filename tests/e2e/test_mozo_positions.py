"""Issue 35, item 7: DPS-MOZO's per-token constraint seen black-box at the default plan.

The positive controls (``tests/e2e/broken_surface_server.py``): ``MOZO_UNMIXED_FIRST`` draws
the first token of every answer from the one-shot distributions unmixed, ``MOZO_UNMIXED_RANDOM``
the token at one random position; both report honest calibration. The real app runs in this
process (oracle engine, production configuration), the fault patched in by ``monkeypatch``.

False failures: the position probe's family-wise error is 1e-3 per run
(:data:`dpicl_audit.probes.positions.ALPHA`), so the honest audit's exit 0
(``test_surface_generation.test_mozo_claim_against_the_reported_eps0``, which runs the
probe) fails for that reason in at most 1 run in 1,000. The leak check compares total
variations (about 0.5 and 0.05) with thresholds 0.3 and 0.2, each about 4 standard errors
away at 100 answers per world. The estimator's tests use seeded generators (deterministic);
their stated rates are those of a fresh seed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dpicl_audit.datasets import load_dataset
from dpicl_audit.mechanisms.dps_mozo.audit import MOZO as MOZO_AUDIT
from dpicl_audit.probes.positions import position_test, positions
from dpicl_audit.results import results_exit_code
from tests.e2e import broken_surface_server as surface
from tests.e2e.test_realistic_faults import production_client
from tests.e2e.test_surface_faults import _audit
from tests.e2e.test_surface_generation import MOZO
from tests.servers import target_plan


def _draw(rng: np.random.Generator, probs: list[float], n: int) -> list[str]:
    return [f"t{i}" for i in rng.choice(len(probs), size=n, p=probs)]


def test_positions_probed() -> None:
    """The first token, the second and the whole answer; never beyond T_max."""
    assert positions(1) == [1]
    assert positions(2) == [1, 2]
    assert positions(48) == [1, 2, 48]


def test_position_test_holds_its_error_at_the_bound_and_sees_an_unmixed_token() -> None:
    """At the worst case a correct server allows (one text exactly ``e^bound`` times as
    likely in one world), 300 seeded repetitions at alpha 0.05 exceed the bound at most 15
    times (the binomial(300, 0.05) tail beyond 30 is below 1e-4; Clopper-Pearson is
    conservative, so fewer are seen); an unmixed token (0.6 against 0.05) at a bound of
    0.05 is seen in every one of 20 repetitions at the probe's alpha 1e-4."""
    rng = np.random.default_rng(35)
    bound = 0.5
    p0 = [0.2, 0.3, 0.5]
    p1 = [0.2 * np.exp(bound), 0.3, 0.5 - 0.2 * (np.exp(bound) - 1)]
    exceeded = sum(
        position_test({1: _draw(rng, p1, 200), 0: _draw(rng, p0, 200)}, bound, 0.05)["exceeds"]
        for _ in range(300)
    )
    assert exceeded <= 30
    for _ in range(20):
        row = position_test(
            {1: _draw(rng, [0.6, 0.35, 0.05], 200), 0: _draw(rng, [0.05, 0.35, 0.6], 200)},
            0.05,
            1e-4,
        )
        assert row["exceeds"] and row["epsilon_lower"] > 0.3, row


@pytest.mark.parametrize("fault", [None, "mozo_unmixed_first"])
async def test_an_unmixed_first_token_leaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """The direct check, without the auditor's estimators: 100 first tokens per world of a
    C1/C0 pair (eps0 for 100 answers: about 0.004). Unmixed, the two worlds' first tokens are
    far apart (total variation about 0.5 measured; the test asks above 0.3); honest, within
    sampling noise (about 0.05; the test asks below 0.2)."""
    if fault is not None:
        for module, name, value in surface.FAULTS[fault].patches:
            monkeypatch.setattr(module, name, value)
    plan = target_plan("http://dpicl.test", **MOZO)
    design = MOZO_AUDIT.build_design(plan, load_dataset(plan.dataset))
    firsts: dict[int, Counter[str]] = {}
    async with production_client(tmp_path, "off") as client:
        for world in (1, 0):
            body = MOZO_AUDIT.context_body(design, plan, 4.0, world, name="leak check")
            body["mechanism"] = dict(body["mechanism"]) | {"queries": 100}
            cid = str((await client.create_context(body))["id"])
            got = [await client.generate(cid, design.query, max_tokens=1) for _ in range(100)]
            firsts[world] = Counter(str(g["text"]) for g in got)
            await client.delete_context(cid)
    tv = sum(abs(firsts[1][y] - firsts[0][y]) for y in firsts[1] | firsts[0]) / 200
    if fault is None:
        assert tv < 0.2, firsts
    else:
        assert tv > 0.3, firsts


@pytest.mark.parametrize(
    "fault", ["mozo_unmixed_first", pytest.param("mozo_unmixed_random", marks=pytest.mark.slow)]
)
@pytest.mark.long
async def test_the_default_plan_flags_a_token_drawn_unmixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """The default DPS-MOZO black-box audit (epsilon 4, few trials: the trials cannot see
    it) reads VIOLATION by the position probe, exit 5, naming the prefix length."""
    res, left = await _audit(tmp_path, fault, monkeypatch, **MOZO)
    assert left == []
    found = res["surface"]["positions"]
    assert found["status"] == "violation", found
    assert res["surface"]["status"] == "violation"
    assert "per-token bound" in res["surface"]["message"]
    assert any(p["exceeds"] and p["position"] == 1 for p in found["positions"]), found
    assert results_exit_code([res]) == 5
