"""``dpicl``: serve the API, plan budgets, export the OpenAPI document."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

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
    """A setting's value from the command line: JSON where it parses (numbers, booleans,
    null), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _settings_json(text: str) -> dict[str, object]:
    """``--settings``: a JSON object, inline or ``@FILE``."""
    source = "--settings"
    if text.startswith("@"):
        source = f"--settings {text}"
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            _fail(f"{source}: cannot read the file: {exc.strerror or exc}")
    try:
        found = json.loads(text)
    except ValueError as exc:
        _fail(f"{source} is not JSON: {exc}")
    if not isinstance(found, dict):
        _fail(f"{source} must be a JSON object of settings, got {type(found).__name__}")
    return found


def _flag_settings(args: list[str]) -> dict[str, object]:
    """Settings given as ``--KEY VALUE`` or ``--KEY=VALUE`` (any setting of the mechanism:
    the form ``dpicl calibrate`` took before ``--set`` and ``--settings``)."""
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key, sep, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not key:
            _fail(f"unexpected argument {arg!r}: give settings as --KEY VALUE or --set KEY=VALUE")
        if not sep:
            if i + 1 >= len(args):
                _fail(f"{arg} needs a value (--KEY VALUE)")
            i += 1
            value = args[i]
        out[key.replace("-", "_")] = _option_value(value)
        i += 1
    return out


def calibration_settings(
    mechanism: str | None, settings: str | None, flags: list[str], sets: list[str]
) -> tuple[str, dict[str, object]]:
    """The mechanism's name and its settings from ``dpicl calibrate``'s command line: the
    ``--settings`` object, then ``--KEY VALUE`` flags, then ``--set KEY=VALUE`` (a later one
    wins). Which keys a mechanism takes is its own settings model's to say."""
    options = _settings_json(settings) if settings is not None else {}
    named = options.pop("name", None)
    if named is not None and not isinstance(named, str):
        _fail(f"--settings: name must be a mechanism's name, got {named!r}")
    if mechanism is not None and named is not None and named != mechanism:
        _fail(f"--mechanism {mechanism!r} and --settings' name {named!r} differ")
    name = mechanism or named
    if name is None:
        _fail("name the mechanism: --mechanism NAME, or a name in --settings")
    options |= _flag_settings(flags)
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--set expects KEY=VALUE, got {item!r}")
        options[key.replace("-", "_")] = _option_value(value)
    return name, options


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Any setting may also be given as --KEY VALUE (--epsilon 1 --partitions 10), the "
    "form of earlier versions. Options the mechanism's settings do not have are refused by "
    "name; a mechanism may read its own planning options (see its documentation).",
)
def calibrate(
    ctx: typer.Context,
    mechanism: Annotated[
        str | None,
        typer.Option(
            help="The mechanism: any name installed here (the mechanism.name of "
            "POST /v1/contexts); optional when --settings names it.",
            show_default=False,
        ),
    ] = None,
    settings: Annotated[
        str | None,
        typer.Option(
            "--settings",
            help="The mechanism's settings as a JSON object, the `mechanism` of "
            "POST /v1/contexts (`name` optional), or @FILE holding one.",
            show_default=False,
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="One setting of the mechanism, as KEY=VALUE (repeatable; JSON values)."
        ),
    ] = None,
) -> None:
    """Print the record a context with the mechanism's settings would store (its noise and
    exact epsilon), as JSON. The settings are validated by the mechanism's own model."""
    from dpicl.mechanisms.registry import MECHANISMS, get_mechanism

    name, options = calibration_settings(mechanism, settings, list(ctx.args), set_ or [])
    if name not in MECHANISMS:
        # Offline: no server is involved, so say what is installed in this environment and
        # how a plug-in gets there.
        _fail(
            f"no mechanism {name!r} is installed in this Python environment "
            f"({sys.prefix}); installed: {', '.join(MECHANISMS)}. A plug-in is found once "
            "its package is installed, e.g. .venv/bin/pip install --no-deps "
            "./examples/laplace_voting for laplace-voting"
        )
    try:
        out = get_mechanism(name).calibration_report(options)
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
