"""The engine process is supervised (issue 47): restarted with backoff after it dies, the calls
in flight refused (503 with Retry-After, nothing charged), ``/readyz`` back to 200 once it is
up, restarts counted by reason, ``/livez`` failing only when restarts keep failing; and a
cancelled call leaves the engine's work (dropped before its batch, chunks not sent).

The oracle simulator stands in for the model (an engine process starts in about a second)."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from dpicl.engines.base import PromptSpec
from dpicl.engines.process.engine import ProcessEngine
from dpicl.engines.process.main import _RELAYED, _Server
from dpicl.engines.process.supervisor import RestartPolicy, SupervisedEngine
from dpicl.engines.process.wire import CANCEL, EngineSpec
from dpicl.engines.transformers.batching import MicroBatcher
from dpicl.errors import EngineError
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context

PROMPTS = [
    PromptSpec(text=f"Review {i}: a fine film\nSentiment:", query=f"a fine film {i}")
    for i in range(20)
]


def _restarts(reason: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "dpicl_engine_restarts_total", {"reason": reason, "outcome": outcome}
    )
    return value or 0.0


def _oracle() -> ProcessEngine:
    return ProcessEngine.start(EngineSpec(name="oracle"))


async def _until(check: Any, within: float = 30.0) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > within:
            raise TimeoutError("not within the timeout")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_a_killed_engine_process_is_restarted_and_answers_again() -> None:
    before = _restarts("signal SIGKILL", "ok")
    policy = RestartPolicy(backoff_s=0.2, backoff_max_s=1.0, failures_live=3)
    engine = await asyncio.to_thread(SupervisedEngine, _oracle, policy)
    try:
        first = engine.engine_pid
        assert (await engine.score_labels(PROMPTS[:2], ["a", "b"])).shape == (2, 2)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(EngineError) as info:
            await asyncio.wait_for(engine.score_labels(PROMPTS[:2], ["a", "b"]), 30)
        assert info.value.status_code == 503
        assert not engine.is_ready()
        assert engine.retry_after_s() > 0  # what Retry-After says meanwhile
        took = await _until(engine.is_ready)
        assert engine.engine_pid != first and engine.restarts == 1
        assert (await engine.score_labels(PROMPTS[:2], ["a", "b"])).shape == (2, 2)
        assert _restarts("signal SIGKILL", "ok") == before + 1
        assert engine.not_alive() is None and engine.retry_after_s() == 0.0
        assert took < 30
    finally:
        await engine.aclose()


async def test_restarts_that_keep_failing_back_off_and_fail_liveness() -> None:
    starts: list[float] = []

    def start() -> ProcessEngine:
        starts.append(time.monotonic())
        if len(starts) > 1:
            raise EngineError("cannot load the model (test)")
        return _oracle()

    policy = RestartPolicy(backoff_s=0.1, backoff_max_s=0.4, failures_live=3)
    engine = await asyncio.to_thread(SupervisedEngine, start, policy)
    try:
        os.kill(engine.engine_pid, signal.SIGKILL)
        await _until(lambda: engine.not_alive() is not None, within=20)
        reason = engine.not_alive()
        assert reason is not None and "3 times in a row" in reason and "(test)" in reason
        gaps = [b - a for a, b in itertools.pairwise(starts[1:])]
        # Doubled after each failure: 0.2 s, then 0.4 s (the cap).
        assert gaps[0] >= 0.19 and gaps[1] >= 0.39, gaps
        with pytest.raises(EngineError, match="restarting") as info:
            await engine.score_labels(PROMPTS[:1], ["a", "b"])
        assert info.value.retry_after_s is not None and info.value.retry_after_s >= 1
        assert _restarts("signal SIGKILL", "failed") >= 3
    finally:
        await engine.aclose()
    n = len(starts)
    await asyncio.sleep(0.6)
    assert len(starts) == n  # closed: no more restarts


def test_a_served_app_refunds_restarts_and_is_ready_again(tmp_path: Path) -> None:
    with make_client(tmp_path, engine_process="on", engine_restart_backoff_s=0.2) as c:
        ready = c.get("/readyz").json()
        body = voting_context(budget={"epsilon": 10.0, "delta": 1e-4})
        cid = c.post("/v1/contexts", json=body, headers=admin_headers()).json()["id"]
        ask = {"context_id": cid, "query": "Private record number 3: customer paid"}
        assert c.post("/v1/classify", json=ask, headers=user_headers()).status_code == 200
        t0 = time.monotonic()
        os.kill(ready["engine_pid"], signal.SIGKILL)
        r = c.post("/v1/classify", json=ask, headers=user_headers())
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        assert int(r.headers["Retry-After"]) >= 1
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() - t0 < 30, "not ready again within 30 s"
            time.sleep(0.1)
        again = c.get("/readyz").json()
        assert again["engine_pid"] not in (ready["engine_pid"], again["pid"])
        assert c.get("/livez").status_code == 200
        r = c.post("/v1/classify", json=ask, headers=user_headers())
        assert r.status_code == 200, r.text
        # The answer refused while the engine was down was never charged.
        spent = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()["spent"]
        assert spent["queries"] == 2
        metrics = c.get("/metrics", headers=admin_headers()).text
        assert 'dpicl_engine_restarts_total{outcome="ok",reason="signal SIGKILL"}' in metrics


async def test_a_cancelled_call_is_dropped_before_its_batch_and_its_chunks_stop() -> None:
    engine = await asyncio.to_thread(ProcessEngine.start, EngineSpec(name="oracle"))
    engine.chunk_prompts = 4
    sent: list[str] = []
    submit, cancel = engine._submit, engine._cancel

    def spy_submit(op: str, args: tuple[Any, ...]) -> Any:
        sent.append(op)
        return submit(op, args)

    def spy_cancel(req_id: int) -> None:
        sent.append("cancel")
        cancel(req_id)

    engine._submit = spy_submit  # type: ignore[method-assign]
    engine._cancel = spy_cancel  # type: ignore[method-assign]
    try:
        # Chunked: 20 prompts are 5 calls of 4, the same scores as one call.
        whole = await engine.call("score", PROMPTS, ["a", "b"])
        chunked = await engine.score_labels(PROMPTS, ["a", "b"])
        assert (chunked == whole).all()
        assert sent.count("score") == 1 + 5
        # Cancelled while its first chunk runs: no further chunk is sent, and the engine
        # process is told to drop the one in flight.
        sent.clear()
        task = asyncio.ensure_future(engine.score_labels(PROMPTS, ["a", "b"]))
        await asyncio.sleep(0)  # the first chunk is sent
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # No further chunk is sent. The cancel goes out when the chunk was still pending; on a
        # loaded machine its answer can arrive before the cancel is seen (no cancel needed):
        # the engine process's side of a cancel is the next test's.
        assert sent in (["score", "cancel"], ["score"]), sent
        assert not engine._pending
        # The engine process serves on.
        assert (await engine.score_labels(PROMPTS[:2], ["a", "b"])).shape == (2, 2)
    finally:
        await engine.aclose()


@pytest.mark.parametrize("overlap", [False, True])
async def test_the_engine_process_drops_a_cancelled_job_before_its_batch_runs(
    monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """Its side of a cancel (engines/process/main.py): a job still queued for the next batch
    is dropped; the batch running meanwhile finishes and answers. The same where the
    batcher launches a batch and reads it back later (issue 46's overlap)."""
    # serve() swaps the engine modules' metrics for relays: put them back afterwards.
    for module, names in _RELAYED.items():
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name))
    release = asyncio.Event()
    batches: list[list[str]] = []

    async def run(jobs: list[str]) -> list[str]:
        batches.append(list(jobs))
        await release.wait()  # the first batch runs until the test lets it end
        return [j.upper() for j in jobs]

    async def launch(jobs: list[str]) -> Any:
        results = await run(jobs)

        async def collect() -> list[str]:
            return results

        return collect

    batcher: MicroBatcher[str, str] = MicroBatcher(
        run, max_wait_s=0.0, max_size=1, launch=launch if overlap else None
    )

    class Engine:
        async def score_labels(self, prompt: str, labels: Any) -> str:
            return await batcher.submit(prompt)

        generate = open_decoding = score_labels

        async def aclose(self) -> None:
            pass

    ours, theirs = multiprocessing.Pipe()
    server = _Server(Engine(), theirs)  # type: ignore[arg-type]
    serving = asyncio.create_task(server.serve())
    try:
        ours.send((1, "score", ("first", [])))
        ours.send((2, "score", ("second", [])))
        await _until(lambda: batches == [["first"]] and 2 in server.tasks)
        ours.send((2, CANCEL, ()))  # its client left while "first" ran
        await _until(lambda: 2 not in server.tasks)
        release.set()
        answer = await asyncio.to_thread(ours.recv)
        assert answer[:3] == (1, True, "FIRST")
        await asyncio.sleep(0.2)
        assert batches == [["first"]]  # "second" never reached the engine
        assert not ours.poll()  # and has no answer
    finally:
        ours.close()
        await asyncio.wait_for(serving, 10)
