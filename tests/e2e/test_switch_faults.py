"""Issue 44, item 4: the whole client surface at the auditor's defaults. A debug view behind an
undocumented query parameter is a VIOLATION (exit 5) naming the switch and the route; a client
``seed`` that seeds the noise is NONCONFORMING (exit 4) naming the parameter; an honest server
passes both probes, natively and through ``--api openai``.

The real app runs in this process (oracle engine, production configuration, every probe of
the default plan) with a fault of ``tests/e2e/broken_channel_server.py`` patched in. The
switches probe compares key sets, so it cannot flag an honest server by chance; the parameter
sweep's error is at most 1e-4 per run and the run's other findings' below 1e-3
(tests/e2e/test_channel_faults.py), so a false failure of the honest cases is rarer than 1e-3.
The faults' detection rates over repeated runs: docs/auditing.md, "Positive controls".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_channel_faults import _audit

#: The default plan (every probe) at one epsilon; fewer trials than the default's 1,000 (the
#: probes do not depend on them).
DEFAULTS = {"mechanism.epsilons": [4.0], "trials": 300, "seed": 21}


async def test_a_debug_query_parameter_is_a_violation_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, res, left = await _audit(tmp_path, "debug_query_param", monkeypatch, **DEFAULTS)
    found = res["switches"]
    assert code == 5 and found["status"] == "violation", found
    (finding,) = found["findings"]
    assert finding["switch"] == "?debug=1" and finding["route"] == "chat", finding
    assert "body debug.clean_votes" in finding["extra"]
    assert "?debug=1" in found["message"] and "chat" in found["message"]
    assert res["parameters"]["status"] == "ok", res["parameters"]
    assert left == 0


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_a_seed_reaching_the_noise_is_nonconforming_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    code, res, _ = await _audit(
        tmp_path, "seed_reaches_noise", monkeypatch, **DEFAULTS, **{"target.api": api}
    )
    swept = res["parameters"]
    assert code == 4 and swept["status"] == "nonconforming", swept
    assert "seed" in str(swept["variant"]) and "seed" in swept["message"], swept["variant"]
    seeded = [v for v in swept["variants"] if v.get("sent", {}).get("seed") is not None]
    assert len(seeded) == 4 and not any(v["refused"] for v in seeded)
    # each seed answers one label, whatever the route
    assert all(len(v["labels"]) == 1 for v in seeded), seeded
    assert res["switches"]["status"] == "ok", res["switches"]


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_honest_server_passes_the_whole_client_surface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    code, res, left = await _audit(tmp_path, None, monkeypatch, **DEFAULTS, **{"target.api": api})
    swept, switches = res["parameters"], res["switches"]
    assert code == 0, res["settings"]
    assert swept["status"] == "ok" and switches["status"] == "ok", (swept, switches)
    assert switches["findings"] == [] and switches["refused"] == []
    routes = ["chat", "completions", "chat-stream", "completions-stream"]
    assert switches["routes"] == (routes if api == "openai" else ["native", *routes])
    # dpicl refuses what would leak or cannot be honoured (400), and ignores the rest
    by: dict[str, Any] = {v["variant"]: v for v in swept["variants"]}
    for name in ("chat, seed 7", "chat, logprobs true", "completions, echo true", "chat, n 2"):
        assert by[name]["refused"], by[name]
    for name in ("chat, frequency_penalty 2", 'completions, user "dpicl-audit"'):
        # answered: screened first (5 answers), 15 more only where those are one label
        v = by[name]
        assert not v["refused"] and sum(v["screening"].values()) == 5, v
        tested = "labels" in v
        assert tested == (len(v["screening"]) == 1), v
        assert not tested or sum(v["labels"].values()) == 15, v
    assert left == 0
