"""The calibration scan (``dpicl_audit.probes.calibration``, issue 35, item 4) against a
simulated server: a refused epsilon (above the server's limit) or one no budget fits is
listed, not a finding; a sigma weaker than its claim is a BUG naming the epsilon; every
context created is deleted; the plan's own epsilons are left to its settings."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpicl_audit.claims import SettingClaims
from dpicl_audit.client import ContextBody
from dpicl_audit.errors import TargetRejected
from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact
from dpicl_audit.probes.calibration import SCAN, scan_calibration

DELTA = 1e-5


class Server:
    """Reports sigma = c / epsilon (the classical shape); refuses epsilon above ``most``."""

    def __init__(self, c: float, most: float = 100.0) -> None:
        self.c, self.most = c, most
        self.live: set[str] = set()
        self.n = 0

    async def create_context(self, body: ContextBody) -> dict[str, Any]:
        eps = float(body["mechanism"]["epsilon"])
        if eps > self.most:
            raise TargetRejected(422, "invalid_request", f"mechanism.epsilon {eps} > {self.most}")
        self.n += 1
        self.live.add(f"c{self.n}")
        return {"id": f"c{self.n}", "mechanism": {"sigma": self.c / eps}}

    async def delete_context(self, cid: str) -> None:
        self.live.remove(cid)


def _body(eps: float) -> ContextBody | None:
    return None if eps == 0.1 else {"mechanism": {"epsilon": eps}}


def _meta(eps: float, info: Mapping[str, Any]) -> SettingClaims:
    sigma = float(info["mechanism"]["sigma"])
    exact = voting_epsilon_exact(sigma, DELTA)
    return SettingClaims(f"eps={eps}", eps, DELTA, sigma=sigma, epsilon_exact=exact)


async def test_an_honest_sigma_passes_and_refusals_are_listed() -> None:
    # sqrt(2) x sqrt(2 ln(1.25 / delta)): the classical sigma, which is safe at every epsilon
    # below 1 and (with sigma = max(classic, analytic)) above it too
    server = Server(c=math.sqrt(2) * math.sqrt(2 * math.log(1.25 / DELTA)) * 1.5, most=32.0)
    found = await scan_calibration(server, _body, _meta, audited=[4.0])
    by_eps = {p["epsilon"]: p for p in found["points"]}
    assert sorted(by_eps) == list(SCAN)
    assert by_eps[16.0]["status"] == "ok"
    assert by_eps[0.1]["status"] == "unchecked"
    assert by_eps[100.0]["status"] == "refused" and "100" in by_eps[100.0]["message"]
    assert found["status"] == "ok", found
    assert found["message"] == "the reported sigma meets the claim at epsilon 16", found
    assert server.live == set()


async def test_a_mechanism_without_a_sigma_is_not_said_to_report_one() -> None:
    """A Laplace mechanism (examples/laplace_voting) reports a scale, no sigma: the scan's
    line names the noise, not a sigma it never saw."""
    server = Server(c=1.0)

    def laplace(eps: float, info: Mapping[str, Any]) -> SettingClaims:
        return SettingClaims(f"eps={eps}", eps, DELTA, sigma=None, epsilon_exact=eps)

    found = await scan_calibration(server, _body, laplace, audited=[])
    assert found["status"] == "ok", found
    assert found["message"] == "the reported noise meets the claim at epsilon 16, 100", found
    assert server.live == set()


async def test_a_weak_sigma_is_a_bug_naming_the_epsilon() -> None:
    server = Server(c=1.0)  # far too little noise at every epsilon
    found = await scan_calibration(server, _body, _meta, audited=[])
    assert found["status"] == "bug"
    assert found["message"].startswith("BUG at epsilon 16:")
    assert all(p["status"] == "bug" for p in found["points"] if p["epsilon"] != 0.1)
    assert server.live == set()
