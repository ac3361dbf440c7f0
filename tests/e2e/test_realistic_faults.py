"""Issue 27: realistic implementation bugs are flagged, the honest server is not, and a server
in production configuration (no DPICL_ALLOW_UNBUDGETED) is audited end to end, ledger
included.

The real app runs in this process (oracle engine, httpx.ASGITransport, lifespan run) with one
fault of ``tests/e2e/broken_realistic_server.py`` patched in by ``monkeypatch``. Every server
here refuses unbudgeted contexts, so every audit below also shows that the auditor's budgeted
contexts are enough.

Measured detection (``python -m tests.e2e.measure_faults``, docs/auditing.md "Positive
controls"): each flagged fault below was flagged in every repetition; the honest server was
never flagged. False-failure rate of the honest-server test: its conformance tests hold at
error <= 1e-3 and a VIOLATION or BUG at 1 - 0.95 per run (the run's family); the observed
bounds sit far below either claim, so a false failure is rarer than 1e-3 in practice.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.report import write_report
from dpicl_audit.results import results_exit_code
from tests.conftest import ADMIN, USER
from tests.e2e import broken_realistic_server as faults
from tests.findings import findings
from tests.servers import target_plan

FLAGGED = ("violation", "bug", "nonconforming")


@asynccontextmanager
async def production_client(
    tmp_path: Path,
    whitebox: str,
    client_class: type[DpiclClient] = DpiclClient,
    wrap: Callable[[Any], Any] | None = None,
) -> AsyncIterator[DpiclClient]:
    """The real app as deployed: unbudgeted contexts refused (the default); the client a
    ``client_class`` (:class:`~dpicl_audit.client.openai.OpenAIClient` for ``--api openai``),
    through the ASGI wrapper ``wrap`` where one is given (a fault that sits in front)."""
    from dpicl.api.app import build_app
    from dpicl.config import Settings

    settings = Settings(
        engine="oracle",
        whitebox=whitebox,  # type: ignore[arg-type]
        database_url=f"sqlite:///{tmp_path}/server.db",
        admin_token=ADMIN,
        api_keys=[USER],
    )
    assert not settings.allow_unbudgeted
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        client = client_class(
            "http://dpicl.test",
            admin_token=ADMIN,
            api_key=USER,
            concurrency=8,
            retries=1,
            backoff=0.01,
            transport=httpx.ASGITransport(app=app if wrap is None else wrap(app)),
        )
        try:
            yield client
        finally:
            await client.aclose()


async def _audit(
    tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch, whitebox: str, **flags: Any
) -> dict[str, Any]:
    if fault is not None:
        for module, name, value in faults.FAULTS[fault].patches:
            monkeypatch.setattr(module, name, value)
    async with production_client(tmp_path, whitebox) as client:
        plan = target_plan("http://dpicl.test", **flags)
        results = await run_audit(
            plan, db=f"sqlite:///{tmp_path}/a.db", target=client, out_dir=tmp_path, progress=False
        )
        left = await client.list_contexts()
    # every context the audit made was budgeted (the server refuses any other)
    assert all(c.get("budget") for c in left), left
    return results


def _statuses(results: dict[str, Any]) -> list[str]:
    return [
        s[key]["verdict"]["status"]
        for s in results["settings"]
        for key in ("black_box", "white_box")
        if s.get(key) and "verdict" in s[key]
    ]


VOTING_BB = {"mechanism.epsilons": [4.0], "trials": 400, "seed": 11}
VOTING_WB = VOTING_BB | {"threat_model": "white-box"}
ESA_WB = {
    "mechanism.name": "esa",
    "mechanism.partitions": 2,
    "mechanism.shots": 2,
    "mechanism.epsilons": [8.0],
    "trials": 120,
    "threat_model": "white-box",
    "seed": 3,
}

MOZO_BB = {
    "mechanism.name": "dps-mozo",
    "mechanism.exemplars": 3,
    "mechanism.epsilons": [4.0],
    "trials": 200,
    "seed": 5,
}


async def test_production_server_is_audited_with_its_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = await _audit(tmp_path, None, monkeypatch, "off", **VOTING_BB)
    assert not set(_statuses(res)) & set(FLAGGED), findings(res)
    (s,) = res["settings"]
    assert s["conformance"]["status"] == "conforming", s["conformance"]
    led = res["ledger"]
    assert led["status"] == "ok", led
    assert [c["ok"] for c in led["checks"]] == [True, True, True, True]
    assert (
        led["answers"] == led["answers_expected"] >= 2 and led["refused_at"] == led["answers"] + 1
    )


@pytest.mark.parametrize(
    ("fault", "whitebox", "flags", "what"),
    [
        ("two_partitions", "off", VOTING_BB, "release rate"),
        ("deterministic", "off", VOTING_BB, "release rate"),
        ("correlated", "off", VOTING_BB, "release rate"),
        ("tail_bounded", "noisy", VOTING_WB, "tails"),
        ("deterministic", "noisy", VOTING_WB, "determinism"),
        ("correlated", "noisy", VOTING_WB, "correlation"),
        pytest.param("esa_partial", "internal", ESA_WB, "noise scale", marks=pytest.mark.long),
        ("batch_seeded_voting", "off", VOTING_BB, "independence"),
        pytest.param("batch_seeded_mozo", "off", MOZO_BB, "independence", marks=pytest.mark.long),
    ],
)
async def test_realistic_fault_is_flagged(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    whitebox: str,
    flags: dict[str, Any],
    what: str,
) -> None:
    res = await _audit(tmp_path, fault, monkeypatch, whitebox, **flags)
    statuses = _statuses(res)
    assert statuses and all(st in FLAGGED for st in statuses), (fault, res["settings"])
    (s,) = res["settings"]
    assert what in s["conformance"]["differs"], s["conformance"]


@pytest.mark.long
async def test_honest_dps_mozo_black_box_conforms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model-free test (answers to one query in a random order) on an honest server."""
    res = await _audit(tmp_path, None, monkeypatch, "off", **MOZO_BB)
    assert not set(_statuses(res)) & set(FLAGGED), findings(res)
    conf = res["settings"][0]["conformance"]
    assert conf["status"] == "conforming" and len(conf["black_box"]["tests"]) == 2, conf


@pytest.mark.long
async def test_honest_white_box_conforms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, flags, wb in (("voting", VOTING_WB, "noisy"), ("esa", ESA_WB, "internal")):
        res = await _audit(tmp_path / name, None, monkeypatch, wb, **flags)
        assert not set(_statuses(res)) & set(FLAGGED), (name, res["settings"])
        assert res["settings"][0]["conformance"]["status"] == "conforming"


async def test_a_ledger_that_misreports_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = VOTING_BB | {"trials": 60}
    res = await _audit(tmp_path, "ledger_remaining", monkeypatch, "off", **flags)
    led = res["ledger"]
    assert led["status"] == "nonconforming", led
    assert "remaining_queries" in led["message"]
    assert results_exit_code([res]) == 4 or "violation" in _statuses(res)


def test_profile_and_budget_sizes() -> None:
    """The verify profile's tail-gap plan, and budgets that hold exactly the planned answers
    under the auditor's own composition (mu-GDP composes to sqrt(q) mu)."""
    from dpicl_audit.estimators.composition import (
        MAX_BUDGET_EPSILON,
        answers_within_budget,
        budget_for,
    )
    from dpicl_audit.estimators.composition import planned_queries as planned
    from dpicl_audit.estimators.gdp import gdp_delta, gdp_mu
    from dpicl_audit.pipeline.profiles import tail_plan

    plan = target_plan("http://dpicl.test")
    tail = tail_plan(plan)
    assert tail is not None and tail.design == "paper" and tail.mechanism.partitions == 3
    assert tail.mechanism.epsilons == (8.0,) and tail.trials == 3000
    assert tail_plan(target_plan("http://dpicl.test", **{"mechanism.name": "esa"})) is None
    for eps in (1.0, 8.0):
        b = budget_for(eps, 1e-5, 100)
        assert b is not None
        mu = gdp_mu(eps, 1e-5)
        assert gdp_delta(b["epsilon"], 10.0 * mu) <= 1e-5 * (1 + 1e-6)
        n = answers_within_budget(eps, 1e-5)
        fits = budget_for(eps, 1e-5, planned(n))
        assert fits is not None and fits["epsilon"] <= MAX_BUDGET_EPSILON


@pytest.mark.parametrize("fault", [None, "tail_bounded"])
async def test_bounded_noise_is_flagged_black_box_by_the_tail_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """Issue 35: uniform noise of the claimed variance, which the trials' mid-range rates do
    not see (0 of 5 at the defaults before the probe), is NONCONFORMING by the tail probe at
    any plan (here epsilon 4, 100 trials); the honest server's probe stops at its first
    release of the rare label (false alarm at most 1e-4)."""
    res = await _audit(tmp_path, fault, monkeypatch, "off", **(VOTING_BB | {"trials": 100}))
    tails = res["tails"]
    assert tails["partitions"] == 3 and tails["epsilon"] == 8.0, tails  # sigma 0.86 suits
    if fault is None:
        assert tails["status"] == "ok" and tails["answers"] < tails["answers_needed"], tails
        assert results_exit_code([res]) == 0, findings(res)
    else:
        assert tails["status"] == "nonconforming" and tails["labels"]["Yes"] == 0, tails
        assert tails["answers"] == tails["answers_needed"]
        assert results_exit_code([res]) == 4
    # The report says what the exit code says, the probe's finding among the findings.
    page = write_report(res["run_id"], f"sqlite:///{tmp_path}/a.db", tmp_path / "report")
    verdict = json.loads((page.parent / "report.json").read_text())["verdicts"][res["run_id"]]
    text = page.read_text()
    table = text[text.index("<h2>From outside</h2>") :]
    assert re.search(r"<td[^>]*>tails</td><td[^>]* class='(\w+)'>", table)[1] == tails["status"]
    if fault is None:
        assert verdict in ("ok", "inconclusive") and "finding nonconforming" not in text
    else:
        assert verdict == "nonconforming", verdict
        assert "<div class='finding nonconforming'>tails: " in text
        assert "badge nonconforming'>NONCONFORMING" in text  # the run's card
