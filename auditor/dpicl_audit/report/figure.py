"""Matplotlib, loaded only when a figure is drawn, and a figure as an inline PNG."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["png", "pyplot"]


def png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
