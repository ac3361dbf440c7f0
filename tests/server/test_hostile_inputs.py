"""Every hostile input of issue 12 (and more) gets a 4xx naming the bad value, quickly.

In-process on SQLite, and through a real ``dpicl serve`` on PostgreSQL under a memory limit:
no 5xx, no process death, no exemplar text in the log."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from dpicl.engines.base import PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.hostile_cases import SECRET, Case, context_cases, inference_cases

#: Generous for a loaded 2-core CI machine; the slow path of issue 12 took 9 s and more.
PER_REQUEST_S = 5.0


def _send(client: Any, case: Case) -> Any:
    headers = (user_headers() if case.user else admin_headers()) | {
        "content-type": "application/json"
    }
    headers |= case.headers
    return client.request(case.method, case.path, content=case.content(), headers=headers)


def _check(client: Any, case: Case) -> None:
    t0 = time.monotonic()
    r = _send(client, case)
    elapsed = time.monotonic() - t0
    assert r.status_code == case.status, (case.name, r.status_code, r.text[:500])
    err = r.json()["error"]
    named = f"{err.get('param')} {err['message']}"
    assert case.names in named, (case.name, err)
    assert elapsed < PER_REQUEST_S, (case.name, elapsed)
    if case.status == 405:
        assert "POST" in r.headers["allow"], case.name


def _voting_context_id(client: Any) -> str:
    body = voting_context(budget={"epsilon": 10.0, "delta": 1e-5})
    r = client.post("/v1/contexts", json=body, headers=admin_headers())
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_hostile_inputs_in_process(tmp_path: Path) -> None:
    with make_client(tmp_path, allow_unbudgeted=False) as c:
        cid = _voting_context_id(c)
        for case in context_cases() + inference_cases(cid):
            _check(c, case)
        # Nothing was stored, nothing was charged.
        listed = c.get("/v1/contexts", headers=admin_headers()).json()["data"]
        assert [x["id"] for x in listed] == [cid]
        assert listed[0]["spent"]["queries"] == 0


def _memory_limited(argv: list[str], limit_bytes: int) -> list[str]:
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("prlimit (util-linux) is needed to cap the server's memory")
    return [prlimit, f"--as={limit_bytes}", "--", *argv]


@pytest.mark.postgres
@pytest.mark.slow
def test_hostile_inputs_against_real_server_on_postgres(
    pg_url: str, start_server: Any, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    # 3 GiB of address space: enough for the oracle server, far below what the PLD grid of
    # epsilon = 1.97e11 asked for (21.6 GB before the kernel killed the process).
    argv = [sys.executable, "-m", "dpicl", "serve", "--port", "{port}"]
    srv = start_server(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_DATABASE_URL": pg_url,
            "DPICL_DB_TIMEOUT_S": "1",
            "DPICL_ALLOW_UNBUDGETED": "false",
            "DPICL_LOG_LEVEL": "debug",
        },
        command=_memory_limited(argv, 3 * 1024**3),
    )
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        cid = _voting_context_id(c)
        for case in context_cases() + inference_cases(cid):
            if not case.http_client_can_send:
                continue
            _check(c, case)
            assert srv.proc.poll() is None, f"server died on {case.name!r}"

        # A database error while exemplars are being written: 503, nothing stored, and the
        # exemplar text appears nowhere in the log (bound parameters are hidden).
        body = voting_context(budget={"epsilon": 1.0, "delta": 1e-5})
        body["exemplars"][0]["input"] = f"{SECRET} locked out"
        eng = sa.create_engine(pg_url)
        with eng.connect() as conn:
            conn.execute(sa.text("LOCK TABLE dpicl_contexts IN ACCESS EXCLUSIVE MODE"))
            r = c.post("/v1/contexts", json=body, headers=admin_headers())
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "storage_unavailable"
            ready = c.get("/readyz")
            live = c.get("/healthz")
            conn.rollback()
        eng.dispose()
        assert live.status_code == 200
        assert ready.status_code in (200, 503)  # SELECT 1 needs no table lock
        assert c.get("/readyz").status_code == 200
        listed = c.get("/v1/contexts", headers=admin_headers()).json()["data"]
        assert [x["id"] for x in listed] == [cid]
    assert srv.proc.poll() is None
    log = srv.log_path.read_text()
    assert "database error" in log  # the failure was logged ...
    assert SECRET not in log  # ... without the exemplars


def test_server_limits_are_settings(tmp_path: Path) -> None:
    with make_client(
        tmp_path, max_exemplars=5, max_partitions=2, max_epsilon=2.0, max_budget_epsilon=3.0
    ) as c:
        cases = [
            (voting_context(), "exemplars", "DPICL_MAX_EXEMPLARS"),
            (
                voting_context(exemplars=voting_context()["exemplars"][:4]),
                "mechanism.partitions",
                "DPICL_MAX_PARTITIONS",
            ),
            (
                voting_context(
                    exemplars=voting_context()["exemplars"][:4],
                    mechanism={"partitions": 2, "epsilon": 2.5},
                ),
                "mechanism.epsilon",
                "DPICL_MAX_EPSILON",
            ),
            (
                voting_context(
                    exemplars=voting_context()["exemplars"][:4],
                    mechanism={"partitions": 2},
                    budget={"epsilon": 4.0, "delta": 1e-5},
                ),
                "budget.epsilon",
                "DPICL_MAX_BUDGET_EPSILON",
            ),
        ]
        for body, param, setting in cases:
            r = c.post("/v1/contexts", json=body, headers=admin_headers())
            assert r.status_code == 422, r.text
            assert r.json()["error"]["param"] == param
            assert setting in r.json()["error"]["message"]


def test_unbudgeted_context_needs_the_setting(tmp_path: Path) -> None:
    with make_client(tmp_path, allow_unbudgeted=False) as c:
        r = c.post("/v1/contexts", json=voting_context(), headers=admin_headers())
        assert r.status_code == 422 and "DPICL_ALLOW_UNBUDGETED" in r.json()["error"]["message"]
    with make_client(tmp_path, allow_unbudgeted=True) as c:
        r = c.post("/v1/contexts", json=voting_context(), headers=admin_headers())
        assert r.status_code == 201, r.text
        body = voting_context()
        del body["budget"]  # omitted is not the same as an explicit null
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "budget"


def test_exact_epsilon_has_bounded_cost_whatever_mu() -> None:
    """Below the schema, too: an absurd mu (issue 12's epsilon of 1.97e11 asked for 21.6 GB
    of PLD grid) is answered by the closed form, quickly and never optimistically."""
    from dpicl.privacy.calibration import epsilon_exact, gaussian_epsilon

    for sigma in (1e-3, 1e-5):
        t0 = time.monotonic()
        eps = epsilon_exact(sigma, 1.0, 1e-5)
        assert time.monotonic() - t0 < 10.0
        assert eps >= gaussian_epsilon(1e-5, 1.0 / sigma) * (1 - 1e-9)


class _PromptRecorder(OracleEngine):
    """The oracle simulator, remembering the prompt texts it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    async def score_labels(self, prompts: Sequence[PromptSpec], labels: Sequence[str]) -> Any:
        self.texts += [p.text for p in prompts]
        return await super().score_labels(prompts, labels)


def test_slot_names_in_exemplars_and_labels_stay_text(tmp_path: Path) -> None:
    """Filled slot after slot, an exemplar holding "{query}" received the query (a model
    then saw every query among the demonstrations), once per slot name, and a label holding
    "{exemplars}" received all the exemplars, once per label."""
    body = voting_context(
        template="{labels}\n{exemplars}\n{query}",
        labels=["Yes {exemplars}", "No {exemplars}"],
        exemplars=[{"input": "{query} " * 50, "output": "Yes {exemplars}"}],
        mechanism={"partitions": 1},
    )
    engine = _PromptRecorder()
    with make_client(tmp_path, engine=engine) as c:
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 201, r.text
        query = {"context_id": r.json()["id"], "query": "zebra crossing " * 500}
        r = c.post("/v1/classify", json=query, headers=user_headers())
        assert r.status_code == 200, r.text
    [text] = engine.texts
    assert text == (
        "Yes {exemplars}, No {exemplars}\n"
        f"Input: {'{query} ' * 50}\nLabel: Yes {{exemplars}}\n{'zebra crossing ' * 500}"
    )


def test_a_chunked_body_over_the_limit_is_413(tmp_path: Path) -> None:
    """Without a Content-Length the limit is met while reading, inside FastAPI's body
    parsing, which turned it into 400 "not valid JSON"."""

    def chunks() -> Iterator[bytes]:
        yield b'{"name": "'
        for _ in range(64):
            yield b"x" * 1024

    with make_client(tmp_path, max_body_bytes=16 * 1024) as c:
        headers = admin_headers() | {"content-type": "application/json"}
        r = c.post("/v1/contexts", content=chunks(), headers=headers)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "payload_too_large"
        assert "16384 bytes" in r.json()["error"]["message"]
