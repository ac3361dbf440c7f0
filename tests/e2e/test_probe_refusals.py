"""Issue 44: a server that refuses some of a probe's requests for a reason of its own (one
query in ten refused at random, ``REFUSE_RANDOM``; a rate limit's 429 with ``Retry-After``)
neither crashes the run nor raises a finding: each probe observes its refusals
(``dpicl_audit.probes.refusals``), the run writes its results and exits 1 (the trials were
refused too: the audit could not ask what it planned).

The real app in this process (oracle engine, production configuration), each probe alone on
a short plan. False failures: the refusals do not depend on the world, and a probe's
refusal test errs at 1e-4 per run; the trials' channel tests at 1e-4; a probe's own tests at
1e-4 each: below 1e-3 per test here.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.probes.refusals import Refused, world_refusals
from dpicl_audit.probes.registry import ALL_PROBES
from dpicl_audit.results import RunResult, refused_trials, results_exit_code
from tests.e2e import broken_channel_server as channels
from tests.e2e.test_realistic_faults import production_client
from tests.servers import target_plan

SHORT = {"mechanism.epsilons": [4.0], "trials": 300, "seed": 21}
#: The routes that answer a query (where a rate limit would bite).
_ANSWERING = ("/v1/classify", "/v1/chat/completions", "/v1/completions")


def rate_limited(app: Any) -> Any:
    """``app`` behind a limiter that answers one query in ten 429 ``rate_limited`` with
    ``Retry-After: 1`` (before the app: nothing charged)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("path") in _ANSWERING and secrets.randbelow(10) == 0:
            body = b'{"error": {"code": "rate_limited", "message": "slow down", "param": null}}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"retry-after", b"1"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return wrapped


async def _audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, wrap: Any, **flags: Any
) -> tuple[int, dict[str, Any], int]:
    if wrap is None:
        for module, name, value in channels.FAULTS["refuse_random"].patches:
            monkeypatch.setattr(module, name, value)
    through = OpenAIClient if api == "openai" else DpiclClient
    async with production_client(tmp_path, "off", through, wrap) as client:
        plan = target_plan("http://dpicl.test", **(SHORT | flags | {"target.api": api}))
        res = await run_audit(
            plan, db=f"sqlite:///{tmp_path}/a.db", target=client, out_dir=tmp_path, progress=False
        )
        left = len(await client.list_contexts())
    return results_exit_code([res]), res, left


@pytest.mark.parametrize("probe", ALL_PROBES)
async def test_each_probe_observes_random_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe: str
) -> None:
    code, res, left = await _audit(tmp_path, monkeypatch, "native", None, probes=[probe])
    flagged = [(n, s.get("message")) for n, s, st in RunResult.from_json(res).probes() if st]
    assert code == 1 and refused_trials([res]), flagged
    assert not flagged
    assert left == 0


@pytest.mark.parametrize(("api", "wrap"), [("openai", None), ("native", rate_limited)])
async def test_every_probe_at_once_through_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, wrap: Any
) -> None:
    code, res, left = await _audit(tmp_path, monkeypatch, api, wrap)
    flagged = [(n, s.get("message")) for n, s, st in RunResult.from_json(res).probes() if st]
    assert code == 1 and not flagged, flagged
    # the surface probe's 200 requests met refusals (0.9**200: never none), read as such
    assert res["surface"]["status"] == "refused", res["surface"]
    assert res["surface"]["refusals"]["p_value"] > 1e-4
    assert left == 0


def _refused(code: str) -> Refused:
    return Refused({"refusal": {"status": 422, "code": code, "message": "m", "param": None}})


def test_world_refusals_dependent_and_not() -> None:
    # C0 refused 20 of 40, C1 never: Fisher's p about 1e-7, a violation
    dependent = [(1, None)] * 40 + [(0, _refused("x"))] * 20 + [(0, None)] * 20
    found = world_refusals(dependent)
    assert found is not None and found["status"] == "violation", found
    # 4 of 40 in each world: refused, not dependent
    alike = ([(w, _refused("x"))] * 4 + [(w, None)] * 36 for w in (1, 0))
    found = world_refusals([a for rows in alike for a in rows])
    assert found is not None and found["status"] == "refused", found
    assert world_refusals([(1, None), (0, None)]) is None
