"""What is public by design in an answer (its cost and the context's budget), checked against
its own prediction (:mod:`.surface`, its docstring): the ``X-DPICL-*`` cost headers equal the
body's figures, and every answer of a route costs what its first one did, in both worlds."""

from __future__ import annotations

import math
from typing import Any

from pydantic import JsonValue

from dpicl_audit.probes.answers import COST_HEADERS, usage_name
from dpicl_audit.probes.sections import Answer

__all__ = ["public_departures"]

_TOL = 1e-9


def _close(a: Any, b: Any) -> bool:
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return bool(a == b)
    if math.isnan(x) or math.isnan(y):
        return False
    return abs(x - y) <= _TOL * max(1.0, abs(x), abs(y))


def public_departures(route: str, answers: list[tuple[int, Answer]]) -> list[str]:
    """Each public field that departs from its prediction on ``route``: a cost header unlike
    the body's figure, or a cost unlike the route's first answer's (module docstring)."""
    out: list[str] = []
    first: dict[str, JsonValue] | None = None
    for world, a in answers:
        pub = a["public"]
        for header, (part, key) in COST_HEADERS.items():
            for name, shown in ((header, f"header {header}"), (usage_name(header), None)):
                if (
                    name in pub
                    and f"{part}.{key}" in pub
                    and not _close(pub[name], pub[f"{part}.{key}"])
                ):
                    out.append(
                        f"{route}: {shown or name} {pub[name]!r} is not the body's "
                        f"{part}.{key} {pub[f'{part}.{key}']!r} (world C{world})"
                    )
        cost = {
            k: v
            for k, v in pub.items()
            if k.startswith("cost.") or k.endswith(("-spent", "_spent"))
        }
        cost.pop("x-dpicl-context-epsilon-spent", None)
        cost.pop(usage_name("x-dpicl-context-epsilon-spent"), None)
        if first is None:
            first = cost
        for k in sorted(set(cost) | set(first)):
            if not _close(cost.get(k), first.get(k)):
                out.append(
                    f"{route}: the cost {k} {cost.get(k)!r} (world C{world}) is not the "
                    f"{first.get(k)!r} of the route's other answers"
                )
    return sorted(set(out))[:8]
