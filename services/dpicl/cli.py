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


class Mechanism(StrEnum):
    voting = "voting"


class CalibrationName(StrEnum):
    classic = "classic"
    analytic = "analytic"


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (DPICL_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (DPICL_PORT).")] = None,
) -> None:
    """Start the HTTP server with the settings from DPICL_* variables."""
    import logging

    import uvicorn

    from dpicl.api.app import build_app

    settings = Settings()
    update = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = settings.model_copy(update=update)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # queries are private data; do not write them to logs
    )


@app.command()
def calibrate(
    mechanism: Annotated[Mechanism, typer.Option(help="Mechanism to calibrate.")],
    epsilon: Annotated[float, typer.Option(help="Per-answer epsilon.")],
    delta: Annotated[float, typer.Option(help="Per-answer delta.")],
    calibration: Annotated[CalibrationName, typer.Option()] = CalibrationName.classic,
) -> None:
    """Print the noise a mechanism needs for (epsilon, delta), as JSON."""
    from dpicl.errors import DpiclError
    from dpicl.privacy.calibration import (
        VOTING_SENSITIVITY,
        epsilon_exact,
        sigma_for,
        validate_privacy_params,
    )

    try:
        validate_privacy_params(epsilon, delta, param_prefix="")
        sens = VOTING_SENSITIVITY
        sigma = sigma_for(epsilon, delta, sens, calibration.value)
        out = {
            "mechanism": mechanism.value,
            "epsilon": epsilon,
            "delta": delta,
            "calibration": calibration.value,
            "sensitivity": sens,
            "sigma": sigma,
            "epsilon_exact": epsilon_exact(sigma, sens, delta),
        }
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
