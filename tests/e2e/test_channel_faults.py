"""Issue 44: refusals and response times that depend on the private votes are flagged (exit
5, never 1), a streamed first token's time too (by the surface probe: the trials are not
streamed), honest servers are not, natively and through ``--api openai``; a refusal that
does not depend on the world ends the run with its results and exit 1.

The real app runs in this process (oracle engine, production configuration,
``httpx.ASGITransport``) with a fault of ``tests/e2e/broken_channel_server.py`` patched in.
Measured at the defaults (``python -m tests.e2e.measure_faults --faults
honest,refuse_close,slow_close``, docs/auditing.md "Positive controls"). The honest runs'
channel tests hold at error 1e-4 per run and their other findings at the run's family
error (below 1e-3 for the conformance tests, 5% per VIOLATION/BUG claim, observed far
below), so a false failure of the honest cases is rarer than 1e-3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.results import refused_trials, results_exit_code
from tests.e2e import broken_channel_server as channels
from tests.e2e.test_realistic_faults import production_client
from tests.servers import target_plan

#: A short audit: one epsilon, the probes that cost most left out (the trials carry both
#: channels).
SHORT = {"mechanism.epsilons": [4.0], "trials": 300, "seed": 12, "probes": ["ledger"]}


async def _audit(
    tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch, **flags: Any
) -> tuple[int, dict[str, Any], int]:
    if fault is not None:
        for module, name, value in channels.FAULTS[fault].patches:
            monkeypatch.setattr(module, name, value)
    through = OpenAIClient if flags.get("target.api") == "openai" else DpiclClient
    async with production_client(tmp_path, "off", through) as client:
        plan = target_plan("http://dpicl.test", **flags)
        res = await run_audit(
            plan, db=f"sqlite:///{tmp_path}/a.db", target=client, out_dir=tmp_path, progress=False
        )
        left = len(await client.list_contexts())
    return results_exit_code([res]), res, left


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_refusal_depending_on_the_votes_is_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    code, res, left = await _audit(
        tmp_path, "refuse_close", monkeypatch, **SHORT, **{"target.api": api}
    )
    (s,) = res["settings"]
    assert code == 5, s
    assert s["refusals"]["status"] == "violation", s["refusals"]
    assert s["refusals"]["refused"][0] == 0 < s["refusals"]["refused"][1]  # C1 never, C0 often
    assert "low_confidence" in s["black_box"]["verdict"]["message"]
    assert left == 0


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_time_depending_on_the_votes_is_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    code, res, _ = await _audit(tmp_path, "slow_close", monkeypatch, **SHORT, **{"target.api": api})
    (s,) = res["settings"]
    assert code == 5, s
    assert s["timing"]["status"] == "violation" and s["timing"]["slower"] == "C0", s["timing"]
    assert s["timing"]["median_difference_s"] < -0.02  # C1's median minus C0's
    assert "ms" in s["black_box"]["verdict"]["message"]


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_honest_server_channels_read_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    code, res, left = await _audit(tmp_path, None, monkeypatch, **SHORT, **{"target.api": api})
    (s,) = res["settings"]
    assert code == 0, s
    assert "refusals" not in s
    assert s["timing"]["status"] == "ok", s["timing"]
    assert left == 0


async def test_refusal_independent_of_the_votes_ends_with_results_and_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No probe: this test is about the trials' refusals alone (each probe's, with the
    # same fault: tests/e2e/test_probe_refusals.py).
    code, res, left = await _audit(
        tmp_path, "refuse_random", monkeypatch, **{**SHORT, "probes": []}
    )
    (s,) = res["settings"]
    assert s["refusals"]["status"] == "refused", s["refusals"]
    assert s["black_box"]["verdict"]["status"] != "violation"
    assert code == 1 and refused_trials([res])
    assert left == 0


async def test_refused_trials_resume_without_loss_or_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused trials are logged like any other: a run that lost the second half of its log
    resumes it, refused trials included, and reads the same refusal finding."""
    import sqlite3

    from dpicl_audit.pipeline.run import resume_audit

    for module, name, value in channels.FAULTS["refuse_close"].patches:
        monkeypatch.setattr(module, name, value)
    db = tmp_path / "a.db"
    async with production_client(tmp_path, "off") as client:
        plan = target_plan("http://dpicl.test", **SHORT)
        first = await run_audit(
            plan, db=f"sqlite:///{db}", target=client, out_dir=tmp_path, progress=False, run_id="r"
        )
        con = sqlite3.connect(db)
        with con:
            refused = con.execute(
                "SELECT COUNT(*) FROM trials WHERE observation LIKE '%low_confidence%'"
            ).fetchone()[0]
            con.execute("DELETE FROM trials WHERE trial_index >= 150")
            con.execute("UPDATE runs SET status = 'interrupted', results = NULL")
        con.close()
        again = await resume_audit(
            "r", db=f"sqlite:///{db}", target=client, out_dir=tmp_path, progress=False
        )
    assert refused > 0 and first["settings"][0]["refusals"]["status"] == "violation"
    (s,) = again["settings"]
    assert s["refusals"]["status"] == "violation", s["refusals"]
    # the figures read the answered trials; with the refused ones, every planned trial
    assert s["trials"] + sum(s["refusals"]["refused"]) == SHORT["trials"]
    con = sqlite3.connect(db)
    n, distinct = con.execute("SELECT COUNT(*), COUNT(DISTINCT trial_index) FROM trials").fetchone()
    con.close()
    assert n == distinct == SHORT["trials"]


@pytest.mark.parametrize("api", ["native", "openai"])
async def test_streamed_first_token_depending_on_the_votes_is_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """The trials are never streamed: a delay of streamed answers alone is seen by the
    surface probe, which times each stream's first token (issue 44)."""
    flags = SHORT | {"probes": ["surface"], "target.api": api}
    code, res, left = await _audit(tmp_path, "slow_close_stream", monkeypatch, **flags)
    (s,) = res["settings"]
    assert s["timing"]["status"] == "ok", s["timing"]  # the trials' own time: not streamed
    first = res["surface"]["first_token"]
    assert code == 5, res["surface"]
    assert res["surface"]["status"] == "violation", res["surface"]
    assert res["surface"]["field"] == "time to first token"
    assert first["status"] == "violation" and first["slower"] == "C0", first
    assert left == 0


async def test_honest_streams_first_token_reads_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, res, _ = await _audit(tmp_path, None, monkeypatch, **SHORT | {"probes": ["surface"]})
    first = res["surface"]["first_token"]
    assert first["status"] == "ok" and first["strata"] >= 2, first
    assert code == 0, res["surface"]
