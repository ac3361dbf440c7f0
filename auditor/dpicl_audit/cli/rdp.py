"""``dpicl-audit divergence``: the exact Renyi divergence of noisy argmax (paper 003, Sec. 4.2)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dpicl_audit.cli.common import app, guard

__all__ = ["divergence"]


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{flag} must be comma-separated numbers, got {text!r}") from None


@app.command("divergence")
def divergence(
    h1: Annotated[str, typer.Option(help="Vote histogram of one world, e.g. 14,12,10,8,6.")],
    h0: Annotated[str, typer.Option(help="Vote histogram of the neighbour, same length.")],
    sigma: Annotated[float, typer.Option(help="Gaussian noise sigma on every count.")],
    orders: Annotated[str, typer.Option(help="Renyi orders > 1.")] = "2,5,10,20,50",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Exact D_alpha of noisy argmax between two histograms (the larger direction)."""
    from dpicl_audit.estimators.rdp_audit import exact_rdp, gaussian_rdp

    a = _numbers(orders, "--orders")
    values = guard(lambda: exact_rdp(_numbers(h1, "--h1"), _numbers(h0, "--h0"), sigma, a)[0])
    gauss = guard(lambda: gaussian_rdp(a, sigma))
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "h1": _numbers(h1, "--h1"),
                    "h0": _numbers(h0, "--h0"),
                    "sigma": sigma,
                    "orders": a,
                    "divergence": values.tolist(),
                    "gaussian_rdp": gauss.tolist(),
                }
            )
        )
        return
    for order, v, g in zip(a, values, gauss, strict=True):
        typer.echo(f"alpha={order:g}  exact={v:.6g}  gaussian(Delta=sqrt2)={g:.6g}")
