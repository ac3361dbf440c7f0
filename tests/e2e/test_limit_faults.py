"""Issue 44, item 3: a server that refuses, for free and with a message naming the length, a
prompt that only a private exemplar pushes over a limit (``REFUSE_LONG_PRIVATE`` of
``tests/e2e/broken_channel_server.py``) is flagged by the DEFAULT audit (exit 5, the limits
probe's VIOLATION), natively and through ``--api openai`` (``long``; a short plan with the
probe alone in the default suite); an honest server is not, and the probe can be left out by
name.

The real app runs in this process (oracle engine, production configuration,
``httpx.ASGITransport``). The honest runs' limits test holds at error 1e-4 (Fisher's exact
test, Bonferroni: dpicl's refusals are functions of the request, so its p-values are 1), and
their other findings at the run's family error (test_channel_faults.py: a false failure of
the honest cases is rarer than 1e-3). The broken server's refusals are deterministic: the
probe's p-value is 2.6e-5 in every run (12 against 12 at every size).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.probes.registry import ALL_PROBES
from dpicl_audit.results import results_exit_code
from tests.e2e import broken_channel_server as channels
from tests.e2e.test_realistic_faults import production_client
from tests.servers import target_plan


async def _audit(
    tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch, **flags: Any
) -> tuple[int, dict[str, Any], int]:
    if fault is not None:
        for module, name, value in channels.FAULTS[fault].patches:
            monkeypatch.setattr(module, name, value)
    through = OpenAIClient if flags.get("target.api") == "openai" else DpiclClient
    async with production_client(tmp_path, "off", through) as client:
        res = await run_audit(
            target_plan("http://dpicl.test", **flags),
            db=f"sqlite:///{tmp_path}/a.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
        left = len(await client.list_contexts())
    return results_exit_code([res]), res, left


#: A short audit with the limits probe alone (the default suite); the full default plan is
#: ``long`` (about 30 s a run on 2 cores).
SHORT = {"mechanism.epsilons": [4.0], "trials": 300, "seed": 12, "probes": ["limits"]}
PLANS = [
    pytest.param("native", SHORT, id="native-short"),
    pytest.param("openai", SHORT, id="openai-short"),
    pytest.param("native", {}, id="native-default", marks=pytest.mark.long),
    pytest.param("openai", {}, id="openai-default", marks=pytest.mark.long),
]


@pytest.mark.parametrize(("api", "flags"), PLANS)
async def test_a_limit_only_private_exemplars_reach_is_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, flags: dict[str, Any]
) -> None:
    code, res, left = await _audit(
        tmp_path, "refuse_long_private", monkeypatch, **flags, **{"target.api": api}
    )
    found = res["limits"]
    assert code == 5, found
    assert found["status"] == "violation" and found["field"] == "refused", found
    # the leaking message is shown
    assert re.search(r"the prompt of partition \d has 2\d{4} characters", found["message"])
    assert left == 0


@pytest.mark.parametrize(("api", "flags"), PLANS)
async def test_an_honest_server_passes_the_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, flags: dict[str, Any]
) -> None:
    code, res, left = await _audit(tmp_path, None, monkeypatch, **flags, **{"target.api": api})
    found = res["limits"]
    assert found["status"] == "ok", found
    assert found["max_query_chars"] == 8000 and found["canary_chars"] == 20_000
    # at the limit both worlds answer; one above it both refuse, with one message
    sizes = {s["query_chars"]: s for s in found["sizes"]}
    assert sizes[8000]["C1"]["answered"] == sizes[8000]["C0"]["answered"] == 12
    assert sizes[8001]["C1"]["messages"] == sizes[8001]["C0"]["messages"] != {}
    assert code == 0, res
    assert left == 0


async def test_the_limits_probe_can_be_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    others = [p for p in ALL_PROBES if p != "limits"]
    flags = SHORT | {"probes": others}
    code, res, _ = await _audit(tmp_path, "refuse_long_private", monkeypatch, **flags)
    assert "limits" not in res and res["probes_left_out"] == ["limits"]
    assert code == 0, res  # the trials' short canary never reaches the limit
