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

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import TargetNotFound, TargetProtocolError
from dpicl_audit.estimators.extra_fields import dependence_test, response_fields
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.plan.deployment import adopt_deployment, deployment_settings
from dpicl_audit.probes.parameters import VARIANTS
from dpicl_audit.results import results_exit_code
from tests.conftest import ADMIN, USER
from tests.e2e import broken_realistic_server as realistic
from tests.e2e import broken_surface_server as surface
from tests.e2e.test_realistic_faults import production_client
from tests.findings import findings
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
    assert results_exit_code([res]) == 0, findings(res)
    assert left == []


@pytest.mark.parametrize("fault", [None, "weak_calibration"])
async def test_the_calibration_scan_sees_a_weak_calibration_the_plan_does_not_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """Issue 35, item 4, at the default epsilons: the plan audits epsilon 4 only, the scan
    reads the sigma the server reports at every other epsilon of probes.calibration.SCAN
    (one context each, no answer), and the unguarded classical sigma is a BUG at 16 and
    above (18.9 at 16); the honest server's sigma meets every claim."""
    from dpicl_audit.probes.calibration import SCAN

    res, left = await _audit(
        tmp_path, fault, monkeypatch, **{"mechanism.epsilons": [4.0], "trials": 100, "seed": 3}
    )
    scan = res["calibration"]
    assert [p["epsilon"] for p in scan["points"]] == [e for e in SCAN if e != 4.0]
    assert left == []
    if fault is None:
        assert scan["status"] == "ok" and {p["status"] for p in scan["points"]} == {"ok"}, scan
        assert results_exit_code([res]) == 0, findings(res)
        return
    bad = [p for p in scan["points"] if p["status"] == "bug"]
    assert bad and bad[0]["epsilon"] == 16.0, scan
    assert bad[0]["epsilon_exact"] == pytest.approx(18.9, abs=0.05)
    assert all(p["status"] == "ok" for p in scan["points"] if p["epsilon"] < 1.0), scan
    assert scan["status"] == "bug" and "BUG at epsilon 16" in scan["message"]
    assert results_exit_code([res]) == 5


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
                target=_FailingTarget(client, 150),
                out_dir=tmp_path,
                progress=False,
            )
        assert await client.list_contexts() == []


DEPLOYED = {
    "name": "support-bot",
    "task": "classification",
    "labels": ["Yes", "No"],
    "exemplars": [{"input": f"message {i}", "output": "Yes" if i % 2 else "No"} for i in range(6)],
    "mechanism": {"name": "voting", "epsilon": 16.0, "delta": 1e-6, "partitions": 3},
    "budget": {"epsilon": 200.0, "delta": 1e-5},
}


async def test_the_default_plan_audits_the_deployments_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, item 5: pointed at a deployed context, the default plan adds its epsilon and
    takes its partitions and delta; --epsilons (a plan's own value) still wins."""
    async with production_client(tmp_path, "off") as client:
        cid = str((await client.create_context(DEPLOYED))["id"])
        flags = {"deployment.context": cid, "trials": 40, "seed": 3}
        res = await run_audit(
            target_plan("http://dpicl.test", **flags),
            db=f"sqlite:///{tmp_path}/a.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
        mech = res["plan"]["mechanism"]
        assert mech["epsilons"] == [1.0, 2.0, 4.0, 8.0, 16.0]
        assert (mech["partitions"], mech["delta"]) == (3, 1e-6)
        assert res["plan"]["deployment"]["context"] == cid
        assert [s["setting"] for s in res["settings"]][-1] == "eps=16"
        res = await run_audit(
            target_plan("http://dpicl.test", **flags, **{"mechanism.epsilons": [4.0]}),
            db=f"sqlite:///{tmp_path}/b.db",
            target=client,
            out_dir=tmp_path,
            progress=False,
        )
        assert res["plan"]["mechanism"]["epsilons"] == [4.0]
        assert res["plan"]["mechanism"]["partitions"] == 3
        # the deployment itself is only read, never queried or deleted
        (left,) = await client.list_contexts()
        assert left["id"] == cid and left["spent"]["queries"] == 0


async def test_deployment_settings_from_an_openai_model() -> None:
    """Through the OpenAI surface the model's dpicl extension names epsilon and delta."""

    class Models:
        async def get_context(self, ident: str) -> dict[str, Any]:
            return {"id": ident, "model": {"id": ident, "dpicl": {"epsilon": 6.0, "delta": 1e-7}}}

    found = await deployment_settings(Models(), "m1")  # type: ignore[arg-type]
    assert found == {"epsilon": 6.0, "delta": 1e-7, "partitions": None}
    plan = adopt_deployment(target_plan("http://x", trials=40), found)
    assert plan.mechanism.epsilons == (1.0, 2.0, 4.0, 6.0, 8.0)
    assert plan.mechanism.delta == 1e-7 and plan.mechanism.partitions == 4

    class Nothing:
        async def get_context(self, ident: str) -> dict[str, Any]:
            raise TargetNotFound(404, "not_found", "no such context")

        async def get_model(self, ident: str) -> dict[str, Any]:
            return {"id": ident}

    with pytest.raises(TargetProtocolError, match="reports no epsilon"):
        await deployment_settings(Nothing(), "m2")  # type: ignore[arg-type]


async def test_a_ledger_that_races_under_concurrency_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, item 3: check-then-charge admits more than the budget when many requests
    are in flight; the sequential probe alone passes it. Every route's burst sees it."""
    res, left = await _audit(
        tmp_path, "racy_ledger", monkeypatch, **{"mechanism.epsilons": [4.0], "trials": 100}
    )
    led = res["ledger"]
    assert led["status"] == "nonconforming", led
    assert "under concurrency" in led["message"]
    routes = {r["route"]: r for r in led["bursts"]["routes"]}
    assert set(routes) == {"native", "chat", "completions", "chat-stream"}
    for r in routes.values():
        assert r["ok"] is False and r["answered"] > r["answers_expected"], r
    assert results_exit_code([res]) == 4
    assert left == []


async def test_the_honest_ledger_holds_under_concurrency_on_every_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res, left = await _audit(tmp_path, None, monkeypatch, **{"mechanism.epsilons": [4.0]})
    led = res["ledger"]
    assert led["status"] == "ok" and led["bursts"]["status"] == "ok", led
    for r in led["bursts"]["routes"]:
        assert r["ok"] is True, r
        assert r["answered"] == r["answers_expected"] == r["spend_rows_answered"] == r["charged"]
        assert r["refused"] == r["in_flight"] - r["answered"]
    assert results_exit_code([res]) == 0, findings(res)
    assert left == []


async def test_an_extra_field_that_carries_the_clean_votes_is_a_violation_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, item 1: the label is honestly private, but an extra response field holds
    the un-noised vote share; the whole response is an observation, so the field's
    dependence on the world given the label is a VIOLATION that names it."""
    res, _ = await _audit_behind(
        tmp_path,
        monkeypatch,
        "leaky_field",
        surface.leaky_app,
        flags={"mechanism.epsilons": [4.0], "trials": 200, "seed": 4},
    )
    (s,) = res["settings"]
    found = s["response_fields"]
    assert found["status"] == "violation" and found["field"] == "confidence", found
    verdict = s["black_box"]["verdict"]
    assert verdict["status"] == "violation" and "'confidence'" in verdict["message"]
    assert results_exit_code([res]) == 5


def test_response_fields_and_their_dependence_test() -> None:
    """The fields kept (public ones dropped), and the test's two sides: a field that tells
    the worlds apart is flagged; one independent of them is not (p-values of a fixed seed)."""
    resp = {
        "label": "Yes",
        "context_id": "ctx_1",
        "cost": {"epsilon": 1.0},
        "budget": {"queries": 3},
        "engine": "oracle",
        "confidence": 0.75,
        "choices": [{"index": 0, "message": {"content": "Yes"}, "finish_reason": "stop"}],
        "dpicl": {"label": "Yes", "task": "classification"},
    }
    assert response_fields(resp) == {
        "choices.0.finish_reason": "stop",
        "confidence": 0.75,
        "dpicl.task": "classification",
    }
    rng = np.random.default_rng(0)
    rows = [
        (w, str(rng.choice(["Yes", "No"])), {"share": 0.5 + 0.1 * w, "noise": float(rng.normal())})
        for w in rng.integers(0, 2, size=200)
    ]
    found = dependence_test(rows)
    assert found is not None and found["status"] == "violation" and found["field"] == "share"
    fair = [(w, a, {"noise": f["noise"], "kind": "x"}) for w, a, f in rows]
    found = dependence_test(fair)
    assert found is not None and found["status"] == "ok" and found["p_value"] > 1e-3
    assert dependence_test([(1, "Yes", {}), (0, "No", {})]) is None


@pytest.mark.parametrize("fault", [None, "racy_ledger"])
async def test_the_openai_surface_at_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """Through the OpenAI surface (``--api openai``): the honest server exits 0 and its
    three routes hold under concurrency; the racy ledger is flagged there too."""
    res, left = await _audit_behind(
        tmp_path,
        monkeypatch,
        fault,
        lambda app: app,
        client_class=OpenAIClient,
        flags={"target.api": "openai", "mechanism.epsilons": [4.0], "trials": 300, "seed": 9},
    )
    bursts = res["ledger"]["bursts"]
    assert [r["route"] for r in bursts["routes"]] == ["chat", "completions", "chat-stream"]
    assert left == []
    if fault is None:
        assert bursts["status"] == "ok" and results_exit_code([res]) == 0, findings(res)
        # the OpenAI answer's own fields were logged and found independent of the world
        assert res["settings"][0]["response_fields"]["status"] == "ok"
    else:
        assert bursts["status"] == "nonconforming" and results_exit_code([res]) == 4


@pytest.mark.parametrize(
    ("fault", "path"),
    [
        (None, "/v1/chat/completions"),
        ("temperature_noise", "/v1/chat/completions"),
        ("temperature_noise", "/v1/completions"),
    ],
)
async def test_a_client_parameter_that_reaches_the_noise_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None, path: str
) -> None:
    """Issue 35, item 2: noise scaled by the client's temperature on one route (none sent:
    as calibrated), the chat route or the completions route only, is NONCONFORMING naming a
    temperature-0 or -2 variant of that route; the honest server, which ignores it on the OpenAI
    routes and refuses it natively, exits 0."""
    # Epsilon 0.5, not 1: the honest majority share (about 0.6) sits far enough from
    # temperature 0's 30 of 30 for the sweep's 1e-4 test; at 1 (about 0.7) 2 runs in 5 missed.
    res, _ = await _audit_behind(
        tmp_path,
        monkeypatch,
        fault,
        functools.partial(surface.temperature_app, paths=(path,)),
        flags={"mechanism.epsilons": [0.5], "trials": 100, "seed": 2},
    )
    swept = res["parameters"]
    assert [v["variant"] for v in swept["variants"]][: len(VARIANTS)] == [n for n, _, _ in VARIANTS]
    native = next(v for v in swept["variants"] if v["variant"].startswith("native"))
    assert native["refused"], native  # the native route names no temperature: 422
    if fault is None:
        assert swept["status"] == "ok", swept
        assert results_exit_code([res]) == 0, findings(res)
    else:
        route = "chat" if path == "/v1/chat/completions" else "completions"
        assert swept["status"] == "nonconforming", swept
        # temperature 0 (no noise: the majority every time) or 2 (twice the noise) departs,
        # alone or pooled (issue 44: by parameter across routes, or by route)
        named = swept["variant"]
        alone = named.startswith(route) and named.endswith(("temperature 0", "temperature 2"))
        pooled = named.startswith(("temperature 0 (", "temperature 2 (", f"route {route} ("))
        assert alone or pooled, swept
        assert results_exit_code([res]) == 4


async def _audit_behind(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str | None,
    wrap: Callable[[Any], Any],
    *,
    flags: dict[str, Any],
    client_class: type[DpiclClient] = DpiclClient,
) -> tuple[dict[str, Any], list[Any]]:
    """A default audit (``flags`` on the plan) of the production app, with ``fault``'s
    patches if any, behind the ASGI wrapper ``wrap``; its results and the contexts left on
    the server afterwards."""
    from dpicl.api.app import build_app
    from dpicl.config import Settings

    if fault is not None:
        for module, name, value in surface.FAULTS[fault].patches:
            monkeypatch.setattr(module, name, value)
    settings = Settings(
        engine="oracle",
        whitebox="off",
        database_url=f"sqlite:///{tmp_path}/server.db",
        admin_token=ADMIN,
        api_keys=[USER],
    )
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        client = client_class(
            "http://dpicl.test",
            admin_token=ADMIN,
            api_key=USER,
            concurrency=8,
            retries=1,
            backoff=0.01,
            transport=httpx.ASGITransport(app=wrap(app)),
        )
        try:
            plan = target_plan("http://dpicl.test", **flags)
            res = await run_audit(
                plan, db=f"sqlite:///{tmp_path}/a.db", target=client, out_dir=tmp_path,
                progress=False,
            )  # fmt: skip
            return res, await client.list_contexts()
        finally:
            await client.aclose()
