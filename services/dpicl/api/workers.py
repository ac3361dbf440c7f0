"""Several server processes on one port: ``DPICL_WORKERS`` (issue 30).

Why: one Python process answers on at most one core at a time (the GIL). On the oracle
engine at concurrency 16, one process took 94% of one core of two while PostgreSQL took 17%
and the client 5% (``top`` beside ``bench/http_load.py --ledger``): the ledger was no longer
what held it, the process was. N worker processes answer on N cores.

How: ``dpicl serve`` binds the port once, and uvicorn's supervisor (``uvicorn.run(...,
workers=N)``) starts N processes that accept on it, starts a new one where one dies, and
stops them all on SIGINT or SIGTERM. Each worker is a fresh interpreter that builds its own
app from the environment (:func:`app_from_env`), so what must be the same in every worker
travels there (:func:`worker_environment`):

* their number, which each worker's share of the cores depends on;
* the admin token, generated once here when none is configured (workers generating their own
  would each accept a different one);
* Prometheus's multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``; a fresh one unless the
  operator set one): ``GET /metrics`` then sums the workers' counters and histograms, and
  gives each budget gauge as the value most recently set by any worker.

What stays per process, as it does across replicas: the engine and its prefix cache, group
commit (:mod:`dpicl.store.group_commit`), the context cache, the wait for this process's own
pending refunds (:mod:`dpicl.privacy.ledger`) and ``DPICL_MAX_CONNECTIONS`` (a bound per
worker). The ledger is one: every charge is the same conditional UPDATE on the one database,
atomic across processes, so N workers cannot overspend where N replicas cannot. torch's
threads default to each worker's share of the cores
(:func:`dpicl.engines.threads.choose_threads`). vLLM is refused (``Settings``): its engine
already batches every request of a process, and each worker would start its own on the GPU.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import uvicorn
from fastapi import FastAPI

from dpicl.api.app import announce_generated_token, build_app
from dpicl.api.http_limits import uvicorn_options
from dpicl.config import Settings
from dpicl.logging_setup import configure_logging, level_of
from dpicl.metrics import MULTIPROCESS_DIR_VAR
from dpicl.store.repository import ContextRepository

__all__ = ["APP_FACTORY", "HTTP_PROTOCOL", "app_from_env", "serve_workers", "worker_environment"]

#: What each worker imports by name (uvicorn passes import strings to its processes).
APP_FACTORY = "dpicl.api.workers:app_from_env"
HTTP_PROTOCOL = "dpicl.api.worker_protocol:WorkerHttpProtocol"


def worker_environment(settings: Settings, metrics_dir: str | None) -> dict[str, str]:
    """The variables every worker must share, to put on top of the environment they inherit:
    their number (``dpicl serve --workers`` sets no variable), the admin token (``settings``
    already holds a generated one) and the metrics folder."""
    env: dict[str, str] = {"DPICL_WORKERS": str(settings.workers)}
    if settings.admin_token is not None:
        env["DPICL_ADMIN_TOKEN"] = settings.admin_token.get_secret_value()
    if metrics_dir is not None:
        env[MULTIPROCESS_DIR_VAR] = metrics_dir
    return env


def app_from_env() -> FastAPI:
    """The app of one worker process: its settings from ``DPICL_*`` (uvicorn calls this)."""
    settings = Settings()
    configure_logging(level_of(settings.log_level), settings.log_format)
    return build_app(settings)


def serve_workers(settings: Settings) -> None:
    """Serve ``settings.workers`` processes on ``settings.host:port`` until stopped."""
    settings, generated = settings.with_generated_secrets()
    if generated:  # printed once, here: the workers receive it as configured
        announce_generated_token(settings)
    # Once, before any worker starts, rather than N workers racing to the same migration
    # (each still checks the revision at start, as a replica does).
    repo = ContextRepository(settings.database_url, timeout_s=settings.db_timeout_s)
    try:
        repo.migrate()
    finally:
        repo.dispose()
    own_dir = None
    if settings.metrics != "off" and not os.environ.get(MULTIPROCESS_DIR_VAR):
        own_dir = tempfile.mkdtemp(prefix="dpicl-metrics-")
    os.environ.update(worker_environment(settings, own_dir))
    try:
        uvicorn.run(
            APP_FACTORY,
            factory=True,
            workers=settings.workers,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            log_config=None,
            access_log=False,
            # The served options, but the protocol by name: a worker builds its own class
            # (worker_protocol.py), since a class made here cannot travel to a new process.
            **(uvicorn_options(settings) | {"http": HTTP_PROTOCOL}),
        )
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
