"""Ctrl-C at each step of a run, in this process: a SIGINT raised at a chosen moment (the
contexts being made, a trial's query, the estimates, each probe from outside while its
first request is in flight) must end ``run_async`` with exit status 130 and the one line
saying how to resume, the run marked interrupted with every trial done so far kept, and
nothing left running ("Task exception was never retrieved"); a bootstrap's clean rows and
a resumed run alike. A second SIGINT during that clean-up stops it too; one before the run
is in the log names nothing to resume. The signal is the real one
(``signal.raise_signal``), handled by asyncio's own handler as a terminal's Ctrl-C is; the
server is real (uvicorn in a thread), so a cancelled request is cancelled on a socket, not
inside the server's code."""

from __future__ import annotations

import dataclasses
import gc
import logging
import signal
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from dpicl_audit.cli.stopping import once_logged, run_async
from dpicl_audit.pipeline import runner as runner_module
from dpicl_audit.pipeline.estimation import estimate_run
from dpicl_audit.pipeline.run import bootstrap_audit, resume_audit, run_audit
from dpicl_audit.pipeline.trials import TrialExecutor
from dpicl_audit.plan import AuditPlan
from dpicl_audit.probes.registry import ALL_PROBES, PROBES
from dpicl_audit.store import TrialStore
from tests.auditor.test_runner import _server_missing
from tests.servers import ADMIN, USER, ThreadServer, target_plan

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing())),
]

FLAGS: dict[str, Any] = {
    "mechanism.epsilons": [1.0, 8.0],
    "trials": 40,
    "batch_size": 5,
    "concurrency": 4,
    "seed": 11,
}
HINT = "dpicl-audit resume ..."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    with ThreadServer(tmp_path_factory.mktemp("srv") / "server.db") as srv:
        yield srv


@pytest.fixture
def ctrl_c_delivered() -> Iterator[None]:
    """SIGINT handled as at a terminal: Python's default handler, which asyncio replaces with
    its own for the run. A test process started with SIGINT ignored (a background job of a
    non-interactive shell) would otherwise ignore the signal, and asyncio with it."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set in the main thread")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


class Trigger:
    """Raises SIGINT once, when ``when(request)`` first holds for a request the client sends
    (every request of the auditor's client goes through ``httpx.AsyncClient.send``)."""

    def __init__(self, when: Callable[[httpx.Request], bool]) -> None:
        self.when = when
        self.fired = 0

    def fire(self) -> None:
        self.fired += 1
        signal.raise_signal(signal.SIGINT)


def _arm(monkeypatch: pytest.MonkeyPatch, trigger: Trigger) -> None:
    send = httpx.AsyncClient.send

    async def sending(self: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> Any:
        if not trigger.fired and trigger.when(request):
            # asyncio's handler cancels the run's task at once; the request below is the
            # await that the cancellation lands on, as a Ctrl-C during a slow answer does.
            trigger.fire()
        return await send(self, request, **kw)

    monkeypatch.setattr(httpx.AsyncClient, "send", sending)


def _counting(path: str, n: int) -> Callable[[httpx.Request], bool]:
    seen = [0]

    def when(request: httpx.Request) -> bool:
        if request.url.path == path and request.method == "POST":
            seen[0] += 1
        return seen[0] >= n

    return when


def _during_probe(monkeypatch: pytest.MonkeyPatch, name: str) -> Callable[[httpx.Request], bool]:
    """True for the requests of probe ``name`` (set while its ``run`` is awaited)."""
    inside = [False]
    probe = PROBES[name]

    async def run(*args: Any) -> Any:
        inside[0] = True
        return await probe.run(*args)

    monkeypatch.setitem(PROBES, name, dataclasses.replace(probe, run=run))
    return lambda request: inside[0]


RESUME = f"interrupted; the trials done so far are in the log; resume with: {HINT}"


def _interrupt(
    start: Coroutine[Any, Any, Any],
    tmp_path: Path,
    trigger: Trigger,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    *,
    run: tuple[str, str],
    line: str = RESUME,
) -> None:
    """Run ``start`` (an audit of ``run``: log URL, run id) to its interruption, with the
    resume hint the command line gives it; check the exit and the one line."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    with pytest.raises(typer.Exit) as stopped:
        run_async(start, resume_hint=once_logged(*run, HINT))
    gc.collect()  # a task dropped with its exception unread says so when it is collected
    assert trigger.fired, "the interruption's moment never came"
    assert stopped.value.exit_code == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [line]
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert not list((tmp_path / "runs").glob("*/results.json"))


def _new_run(server: ThreadServer, tmp_path: Path, **flags: Any) -> tuple[str, str, AuditPlan]:
    """(run id, log URL, plan): each run has its own id, as the server is shared and an
    interrupted run's contexts, kept for its resume, would be adopted by a run of the same id
    instead of created."""
    run_id = f"phases-{uuid.uuid4().hex[:8]}"
    return run_id, f"sqlite:///{tmp_path}/audit.db", target_plan(server.url, **(FLAGS | flags))


def _logged(db: str, run_id: str, status: str = "interrupted") -> int:
    """The run's trials in the log, once it is checked to have ``status``."""
    store = TrialStore(db)
    try:
        assert store.get_run(run_id).status == status
        return sum(store.trial_counts(run_id).values())
    finally:
        store.dispose()


@pytest.mark.usefixtures("ctrl_c_delivered")
@pytest.mark.parametrize(
    "moment",
    ["first context", "trial 25", "second epsilon's contexts", "estimates", *ALL_PROBES],
)
def test_ctrl_c_at_each_step_stops_the_run(
    server: ThreadServer,
    tmp_path: Path,
    moment: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    trials = FLAGS["trials"] * len(FLAGS["mechanism.epsilons"])
    # A probe's run makes that probe alone (the others before it would only take time).
    probes = [moment] if moment in PROBES else list(ALL_PROBES)
    run_id, db, plan = _new_run(server, tmp_path, probes=probes)
    if moment == "first context":
        trigger = Trigger(_counting("/v1/contexts", 1))
    elif moment == "trial 25":
        trigger = Trigger(_counting("/v1/classify", 25))
    elif moment == "second epsilon's contexts":
        # C1 and C0 of epsilon 1 come first; the third context made is epsilon 8's.
        trigger = Trigger(_counting("/v1/contexts", 3))
    elif moment == "estimates":
        trigger = Trigger(lambda request: False)

        def estimating(*args: Any) -> Any:
            trigger.fire()  # from the estimates' thread, as a signal lands on any thread
            return estimate_run(*args)

        monkeypatch.setattr(runner_module, "estimate_run", estimating)
    else:
        trigger = Trigger(_during_probe(monkeypatch, moment))
    _arm(monkeypatch, trigger)
    start = run_audit(plan, db=db, run_id=run_id, out_dir=tmp_path / "runs", progress=False)
    _interrupt(start, tmp_path, trigger, capsys, caplog, run=(db, run_id))
    logged = _logged(db, run_id)
    if moment == "first context":
        assert logged == 0
    elif moment == "trial 25":
        # The trials answered before the signal are kept; the rest are not run.
        assert 0 < logged < trials
    elif moment == "second epsilon's contexts":
        assert logged == FLAGS["trials"]
    else:
        assert logged == trials


@pytest.mark.usefixtures("ctrl_c_delivered")
def test_ctrl_c_stops_a_bootstrap_and_a_resume(
    server: ThreadServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bootstrap's clean rows, and a resumed run's trials, interrupted as a run's are."""
    run_id, db, plan = _new_run(server, tmp_path, **{"bootstrap.n_llm": 40})
    trigger = Trigger(_counting("/v1/debug/classify", 25))
    _arm(monkeypatch, trigger)
    out = tmp_path / "runs"
    start = bootstrap_audit(plan, db=db, run_id=run_id, out_dir=out, progress=False)
    _interrupt(start, tmp_path, trigger, capsys, caplog, run=(db, run_id))
    first = _logged(db, run_id)
    assert 0 < first < 2 * 40

    trigger = Trigger(_counting("/v1/debug/classify", 10))
    _arm(monkeypatch, trigger)
    resumed = resume_audit(
        run_id, admin_token=ADMIN, api_key=USER, db=db, out_dir=out, progress=False
    )
    _interrupt(resumed, tmp_path, trigger, capsys, caplog, run=(db, run_id))
    assert first < _logged(db, run_id) < 2 * 40


@pytest.mark.usefixtures("ctrl_c_delivered")
def test_a_second_ctrl_c_during_the_clean_up_stops_it_too(
    server: ThreadServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id, db, plan = _new_run(server, tmp_path)
    trigger = Trigger(_counting("/v1/classify", 25))
    _arm(monkeypatch, trigger)
    flush = TrialExecutor.flush
    again = [0]

    async def flushing(self: Any) -> None:
        # The first flush after the interruption is the clean-up's: a second Ctrl-C there
        # raises KeyboardInterrupt at once, which the run's clean-up handles as the first.
        if trigger.fired and not again[0]:
            again[0] += 1
            signal.raise_signal(signal.SIGINT)
        await flush(self)

    monkeypatch.setattr(TrialExecutor, "flush", flushing)
    start = run_audit(plan, db=db, run_id=run_id, out_dir=tmp_path / "runs", progress=False)
    _interrupt(start, tmp_path, trigger, capsys, caplog, run=(db, run_id))
    assert again[0] == 1
    assert _logged(db, run_id) > 0


@pytest.mark.usefixtures("ctrl_c_delivered")
def test_ctrl_c_before_the_run_began_has_nothing_to_resume(
    server: ThreadServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Interrupted while the server's health is read (before the run is in the log): no
    command to resume a run that is not there (`resume` would answer "no run")."""
    run_id, db, plan = _new_run(server, tmp_path)
    trigger = Trigger(lambda request: request.url.path == "/healthz")
    _arm(monkeypatch, trigger)
    start = run_audit(plan, db=db, run_id=run_id, out_dir=tmp_path / "runs", progress=False)
    nothing = "interrupted before the run began: nothing was logged, nothing to resume"
    _interrupt(start, tmp_path, trigger, capsys, caplog, run=(db, run_id), line=nothing)
    assert not (tmp_path / "audit.db").exists()
