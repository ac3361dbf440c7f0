"""The surface probe's contexts fit what the server takes (probes/surface.py, _create_pair):
a 422 on the calibration (DPS-MOZO's paper mode admits only so many tokens per budget) halves
the answers per route, down to MIN_PER_WORLD; below it the probe is unchecked, saying why.
Any other rejection is the run's error, not a reason to shrink."""

from __future__ import annotations

from typing import Any

import pytest

from dpicl_audit.errors import TargetRejected
from dpicl_audit.probes.surface import MIN_PER_WORLD, _create_pair


class _Server:
    """Takes contexts of at most ``cap`` answers; rejects others as the server does."""

    def __init__(self, cap: int, param: str = "mechanism.max_tokens", status: int = 422):
        self.cap, self.param, self.status = cap, param, status
        self.asked: list[tuple[int, int]] = []

    async def create_context(self, body: dict[str, Any]) -> dict[str, Any]:
        world, answers = body["world"], body["answers"]
        self.asked.append((world, answers))
        if answers > self.cap:
            raise TargetRejected(self.status, "invalid_request", f"{answers} too many", self.param)
        return {"id": f"c{world}-{answers}"}


def _bodies(world: int, answers: int) -> dict[str, Any]:
    return {"name": "probe", "world": world, "answers": answers}


async def test_halves_until_the_server_takes_the_pair() -> None:
    server = _Server(cap=5 * 10 + 10)
    ids: dict[int, str] = {}
    got = await _create_pair(server, _bodies, 20, 5, 10, ids)  # type: ignore[arg-type]
    assert got == 10
    assert server.asked == [(1, 110), (1, 60), (0, 60)]
    assert ids == {1: "c1-60", 0: "c0-60"}


async def test_unchecked_below_the_least_count_naming_the_refusal() -> None:
    server = _Server(cap=5 * MIN_PER_WORLD - 1)
    ids: dict[int, str] = {}
    got = await _create_pair(server, _bodies, 20, 5, 0, ids)  # type: ignore[arg-type]
    assert isinstance(got, str)
    assert "50 answers" in got and "param mechanism.max_tokens" in got, got
    assert ids == {}


@pytest.mark.parametrize(("status", "param"), [(422, "template"), (401, "mechanism.epsilon")])
async def test_other_rejections_are_not_shrunk(status: int, param: str) -> None:
    server = _Server(cap=0, param=param, status=status)
    with pytest.raises(TargetRejected):
        await _create_pair(server, _bodies, 20, 5, 0, {})  # type: ignore[arg-type]
    assert len(server.asked) == 1
