"""``dpicl``: serve the API, plan budgets, export the OpenAPI document."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from dpicl.config import Settings
from dpicl.errors import DpiclError

app = typer.Typer(
    help="dpicl: differentially private in-context learning server.", no_args_is_help=True
)


#: Settings whose values are never echoed in an error (tokens, a URL's password).
_SECRET_SETTINGS = {"admin_token", "api_keys", "cache_salt_secret", "database_url"}


def load_settings(**overrides: object) -> Settings:
    """The DPICL_* settings with ``overrides`` (command-line flags) on top; a bad value is
    reported by its variable's name and the command exits 2 (not a pydantic traceback)."""
    from pydantic import ValidationError

    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "?"
            where = f"DPICL_{name.upper()}"
            if name in overrides:
                where = f"--{name.replace('_', '-')}"
            shown = "" if name in _SECRET_SETTINGS else f" (got {err.get('input')!r})"
            typer.echo(f"error: {where}: {err['msg']}{shown}", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    host: Annotated[
        str | None,
        typer.Option(help="Bind address.", show_default="DPICL_HOST, else 127.0.0.1"),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Port (0: any free port).", show_default="DPICL_PORT, else 8000"),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Server processes on the port (one ledger; not with vLLM).",
            show_default="DPICL_WORKERS, else 1",
        ),
    ] = None,
) -> None:
    """Start the HTTP server with the settings from DPICL_* variables."""
    from dpicl.engines.threads import set_omp_wait_policy
    from dpicl.logging_setup import configure_logging, level_of

    flags = {"host": host, "port": port, "workers": workers}
    update = {k: v for k, v in flags.items() if v is not None}
    settings = load_settings(**update)
    configure_logging(level_of(settings.log_level), settings.log_format)
    if settings.engine == "transformers":  # vLLM binds and tunes its own OpenMP threads
        set_omp_wait_policy(settings.omp_wait_policy)  # before anything loads torch

    if settings.workers > 1:
        from dpicl.api.workers import serve_workers  # deferred: it loads the app

        try:
            serve_workers(settings)
        except DpiclError as exc:  # the database, before any worker starts
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(2) from exc
        return

    import uvicorn

    from dpicl.api.app import build_app
    from dpicl.api.http_limits import uvicorn_options

    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers go to configure_logging's handler
        # uvicorn's access log prints paths and query strings (ids, private data); dpicl's
        # own (api/access_log.py) prints route templates.
        access_log=False,
        **uvicorn_options(settings),
    )


@app.command()
def migrate() -> None:
    """Migrate the database at DPICL_DATABASE_URL to the newest schema (servers do it too)."""
    from dpicl.store.repository import ContextRepository

    settings = load_settings()
    repo = ContextRepository(settings.database_url, timeout_s=settings.db_timeout_s)
    try:
        repo.migrate()
    except DpiclError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from exc
    finally:
        repo.dispose()
    from dpicl.store.migrations import head

    typer.echo(f"database schema at revision {head()}")


def _option_value(text: str) -> object:
    """A ``--set`` value: JSON where it parses (numbers, booleans, null), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@app.command()
def calibrate(
    mechanism: Annotated[
        str, typer.Option(help="Mechanism to calibrate: any registered name (voting, esa, ...).")
    ],
    epsilon: Annotated[float, typer.Option(help="Epsilon (per answer; DPS-MOZO: in total).")],
    delta: Annotated[float | None, typer.Option(help="Delta.")] = None,
    calibration: Annotated[
        str | None, typer.Option(help="Voting, ESA: classic or analytic.")
    ] = None,
    partitions: Annotated[int | None, typer.Option(help="Voting, ESA: partitions T.")] = None,
    sensitivity: Annotated[
        str | None, typer.Option(help="ESA: tight (2/T) or original (1).")
    ] = None,
    alpha: Annotated[int | None, typer.Option(help="DPS-MOZO paper: Renyi order.")] = None,
    tokens: Annotated[int | None, typer.Option(help="DPS-MOZO: n_queries x T_max.")] = None,
    sample_rate: Annotated[float | None, typer.Option(help="DPS-MOZO: n_shots/|D|.")] = None,
    guarantee: Annotated[
        str | None, typer.Option(help="DPS-MOZO: proven (true epsilon) or paper (nominal).")
    ] = None,
    n_shots: Annotated[int | None, typer.Option(help="DPS-MOZO: shots per token.")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Any other setting of the mechanism, as KEY=VALUE (repeatable)."
        ),
    ] = None,
) -> None:
    """Print the noise a mechanism needs for (epsilon, delta), as JSON."""
    from dpicl.mechanisms.registry import MECHANISMS, get_mechanism

    if mechanism not in MECHANISMS:
        # Offline: no server is involved, so say what is installed in this environment and
        # how a plug-in gets there.
        typer.echo(
            f"error: no mechanism {mechanism!r} is installed in this Python environment "
            f"({sys.prefix}); installed: {', '.join(MECHANISMS)}. A plug-in is found once "
            "its package is installed, e.g. .venv/bin/pip install --no-deps "
            "./examples/laplace_voting for laplace-voting",
            err=True,
        )
        raise typer.Exit(2)
    given = {
        "epsilon": epsilon,
        "delta": delta,
        "calibration": calibration,
        "partitions": partitions,
        "sensitivity": sensitivity,
        "alpha": alpha,
        "tokens": tokens,
        "sample_rate": sample_rate,
        "guarantee": guarantee,
        "n_shots": n_shots,
    }
    options: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.echo(f"error: --set expects KEY=VALUE, got {item!r}", err=True)
            raise typer.Exit(2)
        options[key.replace("-", "_")] = _option_value(value)
    try:
        out = get_mechanism(mechanism).calibration_report(options)
    except DpiclError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from exc
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


@app.command()
def openapi() -> None:
    """Print the OpenAPI document (white-box routes included, as when enabled)."""
    from dpicl.api.app import build_app

    spec = build_app(Settings(whitebox="internal", admin_token="x")).openapi()
    json.dump(spec, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
