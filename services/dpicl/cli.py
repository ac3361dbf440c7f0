"""``dpicl``: serve the API, plan budgets, export the OpenAPI document."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated

import typer

from dpicl.config import Settings

app = typer.Typer(
    help="dpicl: differentially private in-context learning server.", no_args_is_help=True
)


#: queries (<= 1e6) x max_tokens (<= 1024): the most tokens a DPS-MOZO context can ask for.
MAX_MOZO_TOKENS = 1_000_000 * 1024


class Mechanism(StrEnum):
    voting = "voting"
    esa = "esa"
    dps_mozo = "dps-mozo"


class CalibrationName(StrEnum):
    classic = "classic"
    analytic = "analytic"


class Guarantee(StrEnum):
    proven = "proven"
    paper = "paper"


class Sensitivity(StrEnum):
    tight = "tight"
    original = "original"


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
) -> None:
    """Start the HTTP server with the settings from DPICL_* variables."""
    from dpicl.engines.threads import set_omp_wait_policy
    from dpicl.logging_setup import configure_logging

    update = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings(**update)
    # uvicorn's "trace" (5) is below logging's DEBUG and has no name there.
    level = 5 if settings.log_level == "trace" else settings.log_level.upper()
    configure_logging(level, settings.log_format)
    if settings.engine == "transformers":  # vLLM binds and tunes its own OpenMP threads
        set_omp_wait_policy(settings.omp_wait_policy)  # before anything loads torch

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
    from dpicl.errors import DpiclError
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


@app.command()
def calibrate(
    mechanism: Annotated[Mechanism, typer.Option(help="Mechanism to calibrate.")],
    epsilon: Annotated[float, typer.Option(help="Epsilon (per answer; DPS-MOZO: in total).")],
    delta: Annotated[float, typer.Option(help="Delta.")],
    calibration: Annotated[CalibrationName, typer.Option()] = CalibrationName.classic,
    partitions: Annotated[int, typer.Option(help="ESA: partitions T.")] = 10,
    sensitivity: Annotated[Sensitivity, typer.Option(help="ESA: 2/T or 1.")] = Sensitivity.tight,
    alpha: Annotated[int | None, typer.Option(help="DPS-MOZO: Renyi order.")] = None,
    tokens: Annotated[int | None, typer.Option(help="DPS-MOZO: n_queries x T_max.")] = None,
    sample_rate: Annotated[float | None, typer.Option(help="DPS-MOZO: n_shots/|D|.")] = None,
    guarantee: Annotated[
        Guarantee, typer.Option(help="DPS-MOZO: proven (true epsilon) or paper (nominal).")
    ] = Guarantee.proven,
    n_shots: Annotated[int, typer.Option(help="DPS-MOZO proven: shots per token.")] = 4,
) -> None:
    """Print the noise a mechanism needs for (epsilon, delta), as JSON."""
    from dpicl.errors import DpiclError

    try:
        out = _calibration(
            mechanism,
            epsilon,
            delta,
            calibration,
            partitions,
            sensitivity,
            alpha,
            tokens,
            sample_rate,
            guarantee,
            n_shots,
        )
    except DpiclError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from exc
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _calibration(
    mechanism: Mechanism,
    epsilon: float,
    delta: float,
    calibration: CalibrationName,
    partitions: int,
    sensitivity: Sensitivity,
    alpha: int | None,
    tokens: int | None,
    sample_rate: float | None,
    guarantee: Guarantee = Guarantee.proven,
    n_shots: int = 4,
) -> dict[str, object]:
    from dpicl.errors import ConfigurationError
    from dpicl.mechanisms.esa.release import esa_sensitivity
    from dpicl.privacy.calibration import (
        VOTING_SENSITIVITY,
        epsilon_exact,
        sigma_for,
        validate_privacy_params,
    )

    validate_privacy_params(epsilon, delta, param_prefix="")
    _check_bounds(epsilon, delta, partitions, alpha)
    out: dict[str, object] = {"mechanism": mechanism.value, "epsilon": epsilon, "delta": delta}
    if mechanism is Mechanism.dps_mozo:
        from dpicl.mechanisms.dps_mozo.calibration import calibrate_beta

        if tokens is None or sample_rate is None:
            raise ConfigurationError(
                "dps-mozo needs --tokens (n_queries x T_max) and --sample-rate (n_shots/|D|)",
                param="tokens" if tokens is None else "sample_rate",
            )
        _check_mozo_bounds(tokens, sample_rate)
        if guarantee is Guarantee.proven:
            return out | _proven_calibration(epsilon, delta, alpha, tokens, sample_rate, n_shots)
        cal = calibrate_beta(epsilon, delta, alpha, tokens, sample_rate)
        return out | {
            "guarantee": "paper (nominal: Theorem B.3 of paper 004 does not hold)",
            "alpha": cal.alpha,
            "tokens": cal.tokens,
            "sample_rate": cal.sample_rate,
            "beta": cal.beta,
            "rdp_epsilon": cal.rdp_epsilon,
            "per_token_rdp": cal.per_token_rdp,
        }
    if mechanism is Mechanism.esa:
        sens = esa_sensitivity(partitions, sensitivity.value)
        out |= {"partitions": partitions, "sensitivity_mode": sensitivity.value}
    else:
        sens = VOTING_SENSITIVITY
    sigma = sigma_for(epsilon, delta, sens, calibration.value)
    return out | {
        "calibration": calibration.value,
        "sensitivity": sens,
        "sigma": sigma,
        "epsilon_exact": epsilon_exact(sigma, sens, delta),
    }


def _check_bounds(epsilon: float, delta: float, partitions: int, alpha: int | None) -> None:
    """The request schema's bounds (dpicl.domain): the server would refuse the same values."""
    from pydantic import TypeAdapter, ValidationError

    from dpicl.domain import MAX_PARTITIONS, Delta, Epsilon
    from dpicl.errors import ConfigurationError

    for name, kind, value in (("epsilon", Epsilon, epsilon), ("delta", Delta, delta)):
        try:
            TypeAdapter(kind).validate_python(value)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            raise ConfigurationError(f"--{name}: {msg} (got {value!r})", param=name) from None
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigurationError(
            f"--partitions must lie in [1, {MAX_PARTITIONS}], got {partitions!r}",
            param="partitions",
        )
    if alpha is not None and not 2 <= alpha <= 1024:
        raise ConfigurationError(f"--alpha must lie in [2, 1024], got {alpha!r}", param="alpha")


def _check_mozo_bounds(tokens: int, sample_rate: float) -> None:
    from dpicl.errors import ConfigurationError

    if not 1 <= tokens <= MAX_MOZO_TOKENS:
        raise ConfigurationError(
            f"--tokens must lie in [1, {MAX_MOZO_TOKENS}], got {tokens!r}", param="tokens"
        )
    if not 0.0 < sample_rate <= 1.0:  # also false for NaN
        raise ConfigurationError(
            f"--sample-rate must lie in (0, 1], got {sample_rate!r}", param="sample_rate"
        )


def _proven_calibration(
    epsilon: float,
    delta: float,
    alpha: int | None,
    tokens: int,
    sample_rate: float,
    n_shots: int,
) -> dict[str, object]:
    from dpicl.errors import ConfigurationError
    from dpicl.mechanisms.dps_mozo.proven import calibrate_max_log_ratio

    if alpha is not None:
        raise ConfigurationError(
            f"--alpha={alpha} only applies to --guarantee paper", param="alpha"
        )
    if not 1 <= n_shots <= 1024:
        raise ConfigurationError(f"n_shots must lie in [1, 1024], got {n_shots}", param="n_shots")
    if not 1 <= tokens <= 10**12:
        raise ConfigurationError(f"tokens must lie in [1, 10^12], got {tokens}", param="tokens")
    cal = calibrate_max_log_ratio(epsilon, delta, n_shots, sample_rate, tokens)
    return {
        "guarantee": "proven",
        "tokens": cal.tokens,
        "sample_rate": cal.sample_rate,
        "n_shots": cal.n_shots,
        "max_log_ratio": cal.max_log_ratio,
        "per_token_epsilon": cal.per_token_epsilon,
        "amplified_per_token_epsilon": cal.amplified_epsilon,
        "epsilon_spent": cal.epsilon_spent,
    }


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
