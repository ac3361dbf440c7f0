"""Schema-driven fuzzing (schemathesis, pinned) against a real ``dpicl serve`` process:
for every operation, a bounded number of generated requests (valid and invalid by the
schema) gets no 5xx, only documented statuses and bodies that match the schema, and the
server's peak memory stays under a cap."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
# schemathesis is a pytest plugin, so pytest rewrites its modules as they are imported; the
# ones it imports lazily (at the first load of a schema) were rewritten mid-suite, where
# CPython 3.11's parser failed twice ("AST constructor recursion depth mismatch": its AST
# recursion counter is per interpreter, not per thread, and a server thread of an earlier
# test may be compiling). Imported here, every module is rewritten at collection, before
# any server runs.
for _mod in pkgutil.walk_packages(schemathesis.__path__, "schemathesis."):
    with contextlib.suppress(Exception):  # optional extras (their dependencies are absent)
        importlib.import_module(_mod.name)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import FlakyFailure, Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from tests.servers import ADMIN, ServerProcess  # noqa: E402

#: Examples per operation and generation mode: enough to reach every bound in the schema,
#: few enough for a 2-core CI run (about a minute).
EXAMPLES = 30
#: Peak resident memory of the oracle server; it idles near 250 MiB.
MEMORY_CAP_BYTES = 1024**3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    srv = ServerProcess(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_WHITEBOX": "internal",  # fuzz the debug routes too
            "DPICL_DATABASE_URL": f"sqlite:///{tmp / 'fuzz.db'}",
            "DPICL_ALLOW_UNBUDGETED": "false",
        },
        tmp / "server.log",
    )
    srv.wait_ready()
    yield srv
    peak = _peak_rss(srv.proc.pid)
    alive = srv.proc.poll() is None
    srv.stop()
    assert alive, "the server died under fuzzing"
    assert peak < MEMORY_CAP_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _mentions(exc: BaseException, text: str, depth: int = 0) -> bool:
    """Whether ``exc``, its sub-exceptions or their causes carry ``text``."""
    if depth > 20:
        return False
    if text in str(exc):
        return True
    inner = [*getattr(exc, "exceptions", ()), exc.__cause__, exc.__context__]
    return any(_mentions(e, text, depth + 1) for e in inner if e is not None)


def _operations(url: str) -> list[Any]:
    loaded = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in loaded.get_all_operations()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.long
def test_api_fuzz(server: ServerProcess, mode: str) -> None:
    operations = _operations(server.url)
    assert len(operations) >= 10  # every route, the debug ones included
    generation_mode = GenerationMode(mode)
    fuzzed = 0
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=generation_mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,  # the same examples on every run: a failure reproduces
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def fuzz(case: Any) -> None:
            # The schema cannot express the cross-field checks (labels vs outputs, T <= |D|,
            # the server's own limits), so schema-valid data may still get a documented 422.
            case.call_and_validate(
                headers={"Authorization": f"Bearer {ADMIN}"},
                excluded_checks=[positive_data_acceptance],
                timeout=10,
            )

        try:
            try:
                fuzz()
            except FlakyFailure as exc:
                # CPython 3.11's ast module can raise "SystemError: AST constructor recursion
                # depth mismatch" inside Hypothesis's own strategy description (not in the
                # server or this test's checks); replayed, it reads as a flaky failure. Run
                # the operation's examples once more (derandomized: the same examples).
                if not _mentions(exc, "AST constructor recursion depth mismatch"):
                    raise
                fuzz()
        except Unsatisfiable:
            # No parameters or body to break (GET /healthz): no negative case exists.
            assert mode == "negative", operation.label
            continue
        fuzzed += 1
    # Negative mode has nothing to break in the seven operations without any input (GET and
    # HEAD of the three health routes, GET /v1/contexts).
    assert fuzzed >= (len(operations) if mode == "positive" else len(operations) - 7), fuzzed


#: The operations whose schema says everything the server checks of a request (no rule across
#: fields or against stored contexts, no server setting): there a schema-valid request must
#: be accepted. The model of a completion is any id: an unknown one is a 404, which is
#: acceptance in schemathesis' terms (the request was valid; the thing is not there).
ACCEPTANCE_OPERATIONS = (
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "GET /v1/models",
    "GET /v1/models/{model}",
    "GET /v1/contexts",
    "POST /v1/keys",
)


@pytest.mark.slow
def test_schema_valid_requests_are_accepted(server: ServerProcess) -> None:
    """0 "schema-valid request rejected" (schemathesis' positive_data_acceptance) on the
    operations above (issue 39: the schema admitted a null prompt, tool-ended conversations,
    non-id cursors, refused parameters' values and keys with both scopes)."""
    operations = [op for op in _operations(server.url) if op.label in ACCEPTANCE_OPERATIONS]
    assert sorted(op.label for op in operations) == sorted(ACCEPTANCE_OPERATIONS)
    rejected: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def accept(case: Any) -> None:
            case.call_and_validate(
                headers={"Authorization": f"Bearer {ADMIN}"},
                checks=[positive_data_acceptance],
                timeout=10,
            )

        try:
            accept()
        except Exception as exc:  # schemathesis' failure group: name the operation
            rejected.append(f"{operation.label}: {str(exc)[:600]}")
    assert not rejected, "\n\n".join(rejected)
