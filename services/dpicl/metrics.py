"""Prometheus metrics of one server process (``GET /metrics``, api/routes/metrics.py).

Every metric lives in prometheus-client's default registry: one set per process, which is
what one replica exposes (several replicas are several scrape targets; Prometheus sums
them). A replica of several worker processes (``DPICL_WORKERS``) exposes them all at once
through prometheus-client's multiprocess files (api/routes/metrics.py); there a deleted
context's series stay in the files of the workers that answered it until they restart.

Labels are bounded and never carry request content: a route is its template
(``/v1/contexts/{context_id}``, never the path with its id), a refusal its error code, a
database operation its name. Context ids label the per-context privacy metrics, which is
what an operator watching budgets needs; exemplars, queries and outputs never appear.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prometheus_client import Counter, Gauge, Histogram

from dpicl.errors import StorageUnavailable

__all__ = [
    "BATCH_SIZE",
    "BUDGET_EPSILON_REMAINING",
    "BUDGET_EPSILON_SPENT",
    "DB_ERRORS",
    "DB_SECONDS",
    "DEVICE_MEMORY_BYTES",
    "ENGINE_REQUESTS_RUNNING",
    "ENGINE_REQUESTS_WAITING",
    "EPSILON_CHARGED",
    "MULTIPROCESS_DIR_VAR",
    "PREFIX_CACHE_ENTRIES",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_LIMIT_BYTES",
    "PREFIX_CACHE_MISSES",
    "PREFIX_CACHE_SIZE_BYTES",
    "QUEUE_WAIT_SECONDS",
    "REFUSALS",
    "REQUESTS",
    "REQUESTS_RUNNING",
    "REQUEST_SECONDS",
    "db_timer",
    "forget_context",
    "note_refusal",
    "record_release",
    "refusal_codes",
]

#: prometheus-client's multiprocess mode (``DPICL_WORKERS``): where set, each process writes
#: its values under this folder and ``/metrics`` reads them all.
MULTIPROCESS_DIR_VAR = "PROMETHEUS_MULTIPROC_DIR"

#: Latency buckets (seconds) from a cached oracle answer (~1 ms) to a long generation.
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = Counter(
    "dpicl_http_requests",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
)
REQUEST_SECONDS = Histogram(
    "dpicl_http_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by route template.",
    ["method", "route"],
    buckets=_LATENCY,
)
REQUESTS_RUNNING = Gauge(
    "dpicl_requests_running",
    "HTTP requests being handled now: arrived, their response not yet finished (a scrape "
    "counts itself).",
    multiprocess_mode="livesum",
)
REFUSALS = Counter(
    "dpicl_refusals",
    "Error answers of every route, native and OpenAI-compatible, by route template, status "
    "and error code (budget_exhausted, invalid_request, not_found, model_not_found, "
    "storage_unavailable, ...); a refusal written into a started stream has the stream's "
    "status (200).",
    ["route", "status", "code"],
)
DB_SECONDS = Histogram(
    "dpicl_db_operation_duration_seconds",
    "Database calls, from submission to the storage threads to their end, by operation.",
    ["operation"],
    buckets=_LATENCY,
)
DB_ERRORS = Counter(
    "dpicl_db_errors",
    "Database calls that failed (error: the database or its connection failed) or missed "
    "DPICL_DB_TIMEOUT_S (timeout). A refused charge (an exhausted budget) is an answer of "
    "the database, not a failure: dpicl_refusals_total counts it.",
    ["operation", "kind"],
)
BATCH_SIZE = Histogram(
    "dpicl_engine_batch_size",
    "Jobs merged into one engine run by the micro-batcher.",
    ["batcher"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
QUEUE_WAIT_SECONDS = Histogram(
    "dpicl_engine_queue_wait_seconds",
    "Time a job waited in the micro-batcher's queue before its batch started.",
    ["batcher"],
    buckets=_LATENCY,
)
ENGINE_RESTARTS = Counter(
    "dpicl_engine_restarts",
    "Restarts of the engine process by the server's supervisor, by why it had stopped "
    "(exit code N, signal NAME) and how the restart went (ok, failed).",
    ["reason", "outcome"],
)
ENGINE_UP = Gauge(
    "dpicl_engine_up",
    "1 while the engine (its process, when it has one) answers; 0 while it is down or restarting.",
    multiprocess_mode="livemin",
)
ENGINE_REQUESTS_WAITING = Gauge(
    "dpicl_engine_requests_waiting",
    "Engine jobs queued in a micro-batcher for the next batch (with the engine in a process "
    "of its own: as of its latest answer).",
    ["batcher"],
    multiprocess_mode="livesum",
)
ENGINE_REQUESTS_RUNNING = Gauge(
    "dpicl_engine_requests_running",
    "Engine jobs in the batch a micro-batcher is running now (with the engine in a process "
    "of its own: as of its latest answer).",
    ["batcher"],
    multiprocess_mode="livesum",
)
PREFIX_CACHE_SIZE_BYTES = Gauge(
    "dpicl_prefix_cache_size_bytes",
    "Bytes of KV cache the prompt-prefix cache holds (as of the engine's latest answer).",
    multiprocess_mode="livesum",
)
PREFIX_CACHE_LIMIT_BYTES = Gauge(
    "dpicl_prefix_cache_limit_bytes",
    "The prompt-prefix cache's budget in bytes (DPICL_PREFIX_CACHE_MIB).",
    multiprocess_mode="livesum",
)
PREFIX_CACHE_ENTRIES = Gauge(
    "dpicl_prefix_cache_entries",
    "Prompt prefixes the prefix cache holds (as of the engine's latest answer).",
    multiprocess_mode="livesum",
)
DEVICE_MEMORY_BYTES = Gauge(
    "dpicl_engine_device_memory_bytes",
    "Memory of the engine's device: on CUDA allocated and reserved by torch and the "
    "device's total; on CPU the engine process's resident memory (kind=resident).",
    ["device", "kind"],
    multiprocess_mode="mostrecent",
)
PREFIX_CACHE_HITS = Counter(
    "dpicl_prefix_cache_hits", "Prompt-prefix KV-cache lookups that found an entry."
)
PREFIX_CACHE_MISSES = Counter(
    "dpicl_prefix_cache_misses", "Prompt-prefix KV-cache lookups that found none."
)
EPSILON_CHARGED = Counter(
    "dpicl_epsilon_charged",
    "Sum of the per-answer epsilons (as configured) of the answers released, per context: "
    "an upper bound of the spend under basic composition; the composed spend is "
    "dpicl_budget_epsilon_spent.",
    ["context_id"],
)
BUDGET_EPSILON_SPENT = Gauge(
    "dpicl_budget_epsilon_spent",
    "A context's composed epsilon spent, as of the last answer this process released.",
    ["context_id"],
    multiprocess_mode="mostrecent",  # DPICL_WORKERS: the latest any worker set
)
BUDGET_EPSILON_REMAINING = Gauge(
    "dpicl_budget_epsilon_remaining",
    "A context's epsilon left, as of the last answer this process released (budgeted "
    "contexts only).",
    ["context_id"],
    multiprocess_mode="mostrecent",  # DPICL_WORKERS: the latest any worker set
)


@contextmanager
def db_timer(operation: str) -> Iterator[None]:
    """Time one database call; count it as an error if the database failed.

    Only a failure is an error: :class:`StorageUnavailable` is what the store raises for
    every database or connection error. Other exceptions pass uncounted: a refused charge
    (a budget exhausted: the charge's control flow rolls its transaction back), a context
    that is not there, a caller that left (cancelled). Counting those made an alert on this
    metric fire whenever a budget ran out (issue 39).
    """
    t0 = time.perf_counter()
    try:
        yield
    except TimeoutError:
        DB_ERRORS.labels(operation, "timeout").inc()
        raise
    except StorageUnavailable:
        DB_ERRORS.labels(operation, "error").inc()
        raise
    finally:
        DB_SECONDS.labels(operation).observe(time.perf_counter() - t0)


#: The error codes answered in the request being served (api/access_log.py sets a fresh
#: list per request; the error responses append to it). A list, not a value: a task the
#: request starts (a stream) has a copy of the context, and shares the list with it.
_REFUSAL_CODES: ContextVar[list[str] | None] = ContextVar("dpicl_refusal_codes", default=None)


def note_refusal(code: str) -> None:
    """The error ``code`` is being answered (counted by the access log with its status)."""
    codes = _REFUSAL_CODES.get()
    if codes is not None:
        codes.append(code)


@contextmanager
def refusal_codes() -> Iterator[list[str]]:
    """Collect the codes :func:`note_refusal` records in this request (the access log)."""
    codes: list[str] = []
    token = _REFUSAL_CODES.set(codes)
    try:
        yield codes
    finally:
        _REFUSAL_CODES.reset(token)


def record_release(context_id: str, epsilon: float, spent: float, remaining: float | None) -> None:
    """One answer was released: its cost and the context's budget after it."""
    EPSILON_CHARGED.labels(context_id).inc(max(epsilon, 0.0))
    BUDGET_EPSILON_SPENT.labels(context_id).set(spent)
    if remaining is not None:
        BUDGET_EPSILON_REMAINING.labels(context_id).set(remaining)


def forget_context(context_id: str) -> None:
    """A deleted context's series: dropped, so the label set does not grow without bound."""
    for metric in (EPSILON_CHARGED, BUDGET_EPSILON_SPENT, BUDGET_EPSILON_REMAINING):
        with contextlib.suppress(KeyError):  # this process never answered it
            metric.remove(context_id)
