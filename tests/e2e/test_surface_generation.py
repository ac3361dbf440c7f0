"""Issue 35 on the generation mechanisms (DPS-MOZO, ESA): the claim against the reported
calibration, the whole response, ``max_tokens`` against the context's limits and the ledger's
generation routes under bursts.

The real app runs in this process (oracle engine, production configuration), one fault of
``tests/e2e/broken_surface_server.py`` patched in by ``monkeypatch``. The claim check is
deterministic (no false failure); the honest runs' exit 0 fails only where a correct server
reads VIOLATION, BUG or NONCONFORMING, which the run's tests hold to 5% and 1e-4 per run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpicl_audit.mechanisms.dps_mozo.claim import mozo_claim_departure
from dpicl_audit.results import results_exit_code
from tests.e2e.test_surface_faults import _audit
from tests.findings import findings

#: DPS-MOZO at the auditor's defaults (max_tokens 2, |D| 4, one answer per context).
MOZO = {"mechanism.name": "dps-mozo", "mechanism.epsilons": [4.0], "trials": 40, "seed": 5}


@pytest.mark.parametrize("fault", [None, "mozo_one_token"])
@pytest.mark.long
async def test_mozo_claim_against_the_reported_eps0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """eps0 calibrated for one token per answer (max_tokens 2 composed as 1): the exact
    epsilon the auditor derives from the reported eps0 is above the claim, a BUG at the
    defaults; the honest server's is the claim itself (to 1e-9) and exits 0."""
    res, left = await _audit(tmp_path, fault, monkeypatch, **MOZO)
    (s,) = res["settings"]
    assert left == []
    if fault is None:
        assert "calibration_departure" not in s  # (stored only where the claim breaks)
        assert results_exit_code([res]) == 0, findings(res)
    else:
        assert s["epsilon_from_eps0"] > 4.0 * 1.5
        verdict = s["black_box"]["verdict"]
        assert verdict["status"] == "bug" and "weaker than claimed" in verdict["message"]
        assert results_exit_code([res]) == 5


def test_mozo_claim_departures() -> None:
    """The two departures: eps0 too large for the context's tokens, and a per-token
    epsilon reported below 4 eps0; paper mode (no eps0) is not judged here."""
    honest = {"max_log_ratio": 0.0834697331265362, "per_token_epsilon": 0.3338789325061448}
    honest |= {"n_shots": 4, "queries": 3, "max_tokens": 4, "delta": 1e-5}
    exact, why = mozo_claim_departure(honest, 4.0, 4)
    assert exact == pytest.approx(4.0, rel=1e-9) and why is None
    exact, why = mozo_claim_departure(honest | {"queries": 6}, 4.0, 4)
    assert exact is not None and exact > 5.0 and why is not None and "weaker" in why
    _, why = mozo_claim_departure(honest | {"per_token_epsilon": 0.0834697}, 4.0, 4)
    assert why is not None and "understates" in why
    assert mozo_claim_departure({"max_log_ratio": None}, 4.0, 4) == (None, None)


@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "racy_queries"])
@pytest.mark.long
async def test_mozo_query_limit_under_bursts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """Issue 35, item 3 for DPS-MOZO: 16 requests in flight on a context of 2 queries, on
    the native, completions and both streamed routes: the honest server answers exactly 2;
    a limit checked before the answer and not when charged admits more, NONCONFORMING."""
    res, left = await _audit(tmp_path, fault, monkeypatch, **(MOZO | {"trials": 20}))
    led = res["ledger"]
    routes = {r["route"]: r for r in led["bursts"]["routes"]}
    assert set(routes) == {"native", "completions", "chat-stream", "completions-stream"}
    assert left == []
    if fault is None:
        assert led["status"] == "ok", led["message"]
        for r in routes.values():
            assert r["answered"] == r["answers_expected"] == 2 == r["charged"], r
        assert results_exit_code([res]) == 0, findings(res)
    else:
        assert led["status"] == "nonconforming" and "under concurrency" in led["message"]
        assert all(r["answered"] > 2 for r in routes.values()), routes
        assert results_exit_code([res]) == 4
