"""Issue 35: the auditor's defaults against bugs of a deployed API's surfaces, an honest server
at the gate, and an audit that leaves nothing behind.

The real app runs in this process (oracle engine, production configuration: unbudgeted
contexts refused), with one fault of ``tests/e2e/broken_surface_server.py`` patched in by
``monkeypatch``. The calibration check is deterministic (no false failure); the honest runs'
exit 0 fails only on a VIOLATION, BUG or NONCONFORMING of a correct server, which the run's
family and the conformance tests hold to 5% and 1e-3 per run, and which the measured bounds
sit far from (docs/auditing.md, "Positive controls").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.results import results_exit_code
from tests.e2e import broken_realistic_server as realistic
from tests.e2e import broken_surface_server as surface
from tests.e2e.test_realistic_faults import production_client
from tests.servers import target_plan


async def _audit(
    tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch, **flags: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The results of a default black-box audit, and the contexts left on the server."""
    if fault is not None:
        for module, name, value in surface.FAULTS[fault].patches:
            monkeypatch.setattr(module, name, value)
    async with production_client(tmp_path, "off") as client:
        plan = target_plan("http://dpicl.test", **flags)
        results = await run_audit(
            plan, db=f"sqlite:///{tmp_path}/a.db", target=client, out_dir=tmp_path, progress=False
        )
        left = await client.list_contexts()
    return results, left


AT_16 = {"mechanism.epsilons": [16.0], "trials": 200, "seed": 7}


async def test_weak_calibration_is_a_bug_whatever_the_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classical sigma without its guard at epsilon 16: the reported noise's exact epsilon
    (18.9) is above the claim. A BUG from the calibration check, and the ledger's probe
    admits fewer answers than the claim implies."""
    res, left = await _audit(tmp_path, "weak_calibration", monkeypatch, **AT_16)
    (s,) = res["settings"]
    assert s["epsilon_exact"] == pytest.approx(18.9, abs=0.05)
    verdict = s["black_box"]["verdict"]
    assert verdict["status"] == "bug", verdict
    assert "weaker than claimed" in verdict["message"] and "18.9" in verdict["message"]
    led = res["ledger"]
    assert led["status"] == "bug", led
    assert led["answers_expected"] < led["answers_claimed"] == 2
    assert results_exit_code([res]) == 5
    assert left == []


async def test_honest_server_at_16_passes_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, left = await _audit(tmp_path, None, monkeypatch, **AT_16)
    (s,) = res["settings"]
    assert s["epsilon_exact"] <= 16.0 * (1 + 1e-6)
    assert res["ledger"]["status"] == "ok", res["ledger"]
    assert results_exit_code([res]) == 0, res["settings"]
    assert left == []


class _FailingTarget:
    """The client, with its ``fail_at``-th query raising a protocol error (a server that
    answers garbage mid-run)."""

    def __init__(self, inner: Any, fail_at: int) -> None:
        self._inner, self._fail_at, self._asked = inner, fail_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def classify(self, context_id: str, query: str) -> Any:
        self._asked += 1
        if self._asked == self._fail_at:
            raise TargetProtocolError("the server answered garbage (test)")
        return await self._inner.classify(context_id, query)


async def test_a_flagged_run_and_a_failed_run_leave_no_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, item 8: after a flagged run (a fault the release rates see) and after a run
    that fails mid-way, none of the audit's contexts is left on the server."""
    for module, name, value in realistic.FAULTS["deterministic"].patches:
        monkeypatch.setattr(module, name, value)
    flags = {"mechanism.epsilons": [4.0], "trials": 400, "seed": 11}
    async with production_client(tmp_path, "off") as client:
        res = await run_audit(
            target_plan("http://dpicl.test", **flags),
            db=f"sqlite:///{tmp_path}/a.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
        assert results_exit_code([res]) in (4, 5)
        assert await client.list_contexts() == []
        with pytest.raises(TargetProtocolError, match="garbage"):
            await run_audit(
                target_plan("http://dpicl.test", **flags),
                db=f"sqlite:///{tmp_path}/b.db",
                target=_FailingTarget(client, 150),  # type: ignore[arg-type]
                out_dir=tmp_path,
                progress=False,
            )
        assert await client.list_contexts() == []
