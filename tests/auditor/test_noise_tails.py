"""The voting noise's tail probe (``dpicl_audit.probes.tails``, issue 35).

The probe's maths against closed forms and simulation, and the probe itself against
simulated servers (pure numpy, no HTTP): Gaussian noise of the reported sigma passes whatever
the engine votes; uniform noise of the same variance is NONCONFORMING; the epsilon is found
for a calibration other than the classical one; every context it creates is deleted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.client import ContextBody
from dpicl_audit.errors import TargetRejected
from dpicl_audit.probes.tails import (
    ALPHA,
    BOUND,
    PARTITIONS,
    ROUND,
    answers_needed,
    least_release_rate,
    probe_tails,
    tail_sigma,
)

LABELS = ("Yes", "No")


def test_the_least_release_rate_is_the_gaussian_tail_at_the_widest_gap() -> None:
    """Phi(-T / (sigma sqrt 2)) against 2e6 simulated noisy argmaxes over [0, T]; the
    binomial test's false-failure rate is 1e-6."""
    rng = np.random.default_rng(0)
    sigma, n = 0.86, 2_000_000
    noise = rng.normal(0.0, sigma, size=(n, 2))
    released_yes = int(np.sum(0.0 + noise[:, 0] > PARTITIONS + noise[:, 1]))
    rate = least_release_rate(PARTITIONS, sigma)
    assert rate == pytest.approx(0.5 * math.erfc(PARTITIONS / (2 * sigma)), rel=1e-12)
    assert stats.binomtest(released_yes, n, rate).pvalue > 1e-6
    # the classical calibration at epsilon 8 suits the probe: 2 sqrt 3 sigma just below 3
    assert tail_sigma(PARTITIONS, 0.86) and BOUND * 0.86 < PARTITIONS
    assert not tail_sigma(PARTITIONS, 0.6) and not tail_sigma(PARTITIONS, 0.87)


@pytest.mark.parametrize("rate", [0.0068, 0.01, 0.3])
def test_answers_needed_is_the_least_count_that_rejects_at_alpha(rate: float) -> None:
    n = answers_needed(rate)
    assert 2 * (1 - rate) ** n <= ALPHA < 2 * (1 - rate) ** (n - 1)
    with pytest.raises(ValueError, match="rate must be"):
        answers_needed(0.0)


class SimulatedServer:
    """A voting server over ``votes(body)`` with noise from ``noise``; sigma = c / epsilon
    (the classical calibration's shape); contexts hold the answers their budget says."""

    def __init__(
        self,
        noise: Callable[[np.random.Generator, float], np.ndarray],
        *,
        votes: tuple[int, int] = (0, PARTITIONS),
        c: float = 6.88,
        seed: int = 0,
    ) -> None:
        self.noise, self.votes, self.c = noise, np.asarray(votes, float), c
        self.rng = np.random.default_rng(seed)
        self.contexts: dict[str, dict[str, Any]] = {}
        self.created = 0
        self.asked = 0

    async def create_context(self, body: ContextBody) -> dict[str, Any]:
        self.created += 1
        cid = f"c{self.created}"
        sigma = self.c / float(body["mechanism"]["epsilon"])
        self.contexts[cid] = {"sigma": sigma, "left": int(body["answers"])}
        return {"id": cid, "mechanism": {"sigma": sigma}}

    async def delete_context(self, cid: str) -> None:
        del self.contexts[cid]

    async def classify(self, cid: str, query: str) -> dict[str, Any]:
        ctx = self.contexts[cid]
        if ctx["left"] <= 0:
            raise TargetRejected(402, "budget_exhausted", f"context {cid} is spent", None)
        ctx["left"] -= 1
        self.asked += 1
        noisy = self.votes + self.noise(self.rng, ctx["sigma"])
        return {"label": LABELS[int(np.argmax(noisy))]}


def gaussian(rng: np.random.Generator, sigma: float) -> np.ndarray:
    return rng.normal(0.0, sigma, size=2)


def uniform(rng: np.random.Generator, sigma: float) -> np.ndarray:
    half = sigma * math.sqrt(3.0)
    return rng.uniform(-half, half, size=2)


def make(epsilon: float, partitions: int, answers: int) -> tuple[ContextBody, str]:
    assert partitions == PARTITIONS and answers >= 1
    body: ContextBody = {"mechanism": {"epsilon": epsilon}, "answers": answers}
    return body, "is it there?"


async def _probe(server: SimulatedServer, capacity: int = 10_000) -> dict[str, Any]:
    return dict(await probe_tails(server, make, LABELS, capacity=lambda eps: capacity))


@pytest.mark.parametrize("votes", [(0, 3), (3, 0), (1, 2)])
async def test_gaussian_noise_passes_whatever_the_engine_votes(votes: tuple[int, int]) -> None:
    """Each label comes back within the answers needed, whatever the clean votes (an honest
    server is flagged in at most 1e-4 of runs: 20 runs here fail together at most 2e-3)."""
    for seed in range(20):
        server = SimulatedServer(gaussian, votes=votes, seed=seed)
        found = await _probe(server)
        assert found["status"] == "ok", found
        assert min(found["labels"].values()) >= 1 and found["answers"] < found["answers_needed"]
        assert server.contexts == {}, "every context deleted"


async def test_honest_stopping_costs_about_one_over_the_least_rate() -> None:
    """The honest probe stops at the round of the first rare label: mean answers within
    ROUND / 2 of 1 / r (+- 3 standard errors over 200 runs: false failure about 3e-3)."""
    used = []
    for seed in range(200):
        found = await _probe(SimulatedServer(gaussian, seed=seed))
        used.append(found["answers"])
    r = least_release_rate(PARTITIONS, 6.88 / 8.0)
    geometric_sd = math.sqrt(1 - r) / r
    assert abs(np.mean(used) - (1 / r + ROUND / 2)) < 3 * geometric_sd / math.sqrt(200) + ROUND / 2


async def test_uniform_noise_of_the_claimed_variance_is_nonconforming() -> None:
    server = SimulatedServer(uniform)
    found = await _probe(server, capacity=500)  # several contexts' budgets
    assert found["status"] == "nonconforming", found
    assert found["labels"]["Yes"] == 0 and found["answers"] == found["answers_needed"]
    assert found["p_value"] <= ALPHA
    assert "'Yes' never released" in found["message"] and "tails" in found["message"]
    assert server.created == math.ceil(found["answers_needed"] / 500)
    assert server.contexts == {}, "every context deleted"


async def test_another_calibration_gets_an_epsilon_whose_sigma_suits() -> None:
    """A server whose sigma at epsilon 8 is 0.5 (its calibration tighter than the classical
    one): the probe rescales the epsilon until 2 sqrt 3 sigma sits just below T."""
    server = SimulatedServer(gaussian, c=4.0)
    found = await _probe(server)
    assert found["status"] == "ok", found
    assert tail_sigma(PARTITIONS, found["sigma"]) and found["epsilon"] < 8.0
    uniform_server = SimulatedServer(uniform, c=4.0)
    assert (await _probe(uniform_server))["status"] == "nonconforming"


async def test_a_refusal_or_a_foreign_label_is_unchecked_not_a_finding() -> None:
    class Refusing(SimulatedServer):
        async def classify(self, cid: str, query: str) -> dict[str, Any]:
            if self.asked >= 10:
                raise TargetRejected(429, "busy", "too many requests", None)
            return await super().classify(cid, query)

    server = Refusing(uniform)
    found = await _probe(server)
    assert found["status"] == "unchecked" and "refused after" in found["message"]
    assert server.contexts == {}

    class Foreign(SimulatedServer):
        async def classify(self, cid: str, query: str) -> dict[str, Any]:
            await super().classify(cid, query)
            return {"label": "Maybe"}

    found = await _probe(Foreign(gaussian))
    assert found["status"] == "unchecked" and "'Maybe'" in found["message"]


async def test_a_refused_probe_context_is_unchecked_and_nothing_is_left() -> None:
    """A server that refuses the probe's contexts (its epsilon limit below 8, or a third
    context refused mid-probe) reads unchecked, not a finding and not an error."""

    class Capped(SimulatedServer):
        most = 0

        async def create_context(self, body: ContextBody) -> dict[str, Any]:
            if self.created >= self.most:
                raise TargetRejected(422, "invalid_request", "mechanism.epsilon too high", None)
            return await super().create_context(body)

    server = Capped(uniform)
    server.most = 0
    found = await _probe(server)
    assert found["status"] == "unchecked" and "refused the probe's context" in found["message"]
    server = Capped(uniform)
    server.most = 2
    found = await _probe(server, capacity=100)
    assert found["status"] == "unchecked" and "refused after 200 answers" in found["message"]
    assert server.contexts == {}
