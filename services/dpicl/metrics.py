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

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "BATCH_SIZE",
    "BUDGET_EPSILON_REMAINING",
    "BUDGET_EPSILON_SPENT",
    "DB_ERRORS",
    "DB_SECONDS",
    "EPSILON_CHARGED",
    "MULTIPROCESS_DIR_VAR",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_MISSES",
    "QUEUE_WAIT_SECONDS",
    "REFUSALS",
    "REQUESTS",
    "REQUEST_SECONDS",
    "db_timer",
    "forget_context",
    "record_release",
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
REFUSALS = Counter(
    "dpicl_refusals",
    "Error answers by their error code (budget_exhausted, invalid_request, "
    "storage_unavailable, ...).",
    ["code"],
)
DB_SECONDS = Histogram(
    "dpicl_db_operation_duration_seconds",
    "Database calls, from submission to the storage threads to their end, by operation.",
    ["operation"],
    buckets=_LATENCY,
)
DB_ERRORS = Counter(
    "dpicl_db_errors",
    "Database calls that failed (error) or missed DPICL_DB_TIMEOUT_S (timeout).",
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
    """Time one database call; count it as an error if it raises."""
    t0 = time.perf_counter()
    try:
        yield
    except TimeoutError:
        DB_ERRORS.labels(operation, "timeout").inc()
        raise
    except BaseException:
        DB_ERRORS.labels(operation, "error").inc()
        raise
    finally:
        DB_SECONDS.labels(operation).observe(time.perf_counter() - t0)


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
