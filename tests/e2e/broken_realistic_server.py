"""Positive controls of issue 27: realistic implementation bugs, not crude ones.

Each fault is an object with ``install()`` and ``WARNING`` (:mod:`tests.servers`), and
``patches``: the (module, attribute, replacement) triples it installs, so that an in-process
test can apply them with ``monkeypatch`` and undo them. Start one by hand, from the
repository root (settings from ``DPICL_*`` as usual):

    python -m tests.servers tests.e2e.broken_realistic_server:TWO_PARTITIONS PORT

Everything the server *reports* is unchanged (sigma, epsilon, epsilon_exact, the ledger's
charges, the debug endpoint's ``sigma``). The faults:

* ``TWO_PARTITIONS``: an off-by-one in the partition slices: every partition also sees the
  first exemplar of the next one, so a replaced exemplar reaches two partitions (the
  sensitivity doubles). Against the pivotal design the release rates move far from the
  closed form.
* ``DETERMINISTIC``: the voting noise is drawn from a generator seeded by the clean votes
  (a "reproducible answers" cache): the same query always gets the same answer.
* ``TAIL_BOUNDED``: uniform voting noise of the claimed variance (``sigma sqrt 3`` half
  width): right scale, no tails.
* ``CORRELATED``: one Gaussian draw of the claimed sigma added to every count: each count's
  variance is right, the labels' noises are perfectly correlated (the argmax never moves).
* ``ESA_PARTIAL``: ESA's noise is added to the first half of the embedding's dimensions only.
* ``LEDGER_REMAINING``: the ledger reports one more remaining answer than its budget holds.
* ``BATCH_SEEDED_VOTING``: private voting's randomness (partition votes and noise) comes from
  one seed per 8 consecutive requests: right noise, shared between the answers of a batch.
* ``BATCH_SEEDED_MOZO``: DPS-MOZO's randomness comes from one seed per 8 consecutive
  requests (a batch's seed shared by its requests, like a generator seeded by the clock's
  second under load): answers to one query within a batch are identical.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import dpicl.mechanisms.dps_mozo.mechanism as mozo_mechanism
import dpicl.mechanisms.esa.pipeline as esa_pipeline
import dpicl.mechanisms.voting.pipeline as voting_pipeline
import dpicl.mechanisms.voting.release as voting_mech
import dpicl.pipelines.partitions as partitions_mod
import dpicl.privacy.ledger as ledger_mod
from dpicl.mechanisms.esa.release import EsaRelease, nearest
from dpicl.mechanisms.voting.release import VotingRelease, vote_histogram
from dpicl.pipelines.votes import partition_votes

_honest_positions = partitions_mod._partition_positions
_honest_remaining = ledger_mod.remaining_queries
_honest_run_mozo = mozo_mechanism.run_mozo
# One counter per fault: a shared one carried the voting fault's 400 requests into the
# DPS-MOZO fault's seeds when both ran in one process (seeds 50-75 all released the model's
# dominant answer there: every answer identical, nothing for the order test to see).
_vote_requests = itertools.count()
_mozo_requests = itertools.count()
_honest_private_vote = voting_pipeline.private_vote


def batch_seeded_vote(
    scores: np.ndarray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """Honest private voting on a generator seeded once per 8 consecutive requests."""
    shared = np.random.default_rng(next(_vote_requests) // 8)
    return _honest_private_vote(scores, sigma, temperature, shared)


async def batch_seeded_mozo(*args: Any, rng: np.random.Generator, **kwargs: Any) -> Any:
    """DPS-MOZO with one generator seed per 8 consecutive requests instead of OS entropy."""
    seed = next(_mozo_requests) // 8
    return await _honest_run_mozo(*args, rng=np.random.default_rng(seed), **kwargs)


def generous_remaining(mu2_spent: float, mu2_max: float, mu2_per_query: float) -> int:
    """The ledger's remaining answers, one too many (what it reports, not what it refuses)."""
    return int(_honest_remaining(mu2_spent, mu2_max, mu2_per_query)) + 1


def _overlapping_positions(
    exemplars: tuple[tuple[str, str], ...], partitions: int, seed: int, scheme: str
) -> tuple[tuple[int, ...], ...]:
    """The honest groups, each with the next group's first exemplar added (off by one)."""
    groups = _honest_positions(exemplars, partitions, seed, scheme)
    t = len(groups)
    if t < 2:
        return groups
    return tuple(g + groups[(i + 1) % t][:1] for i, g in enumerate(groups))


def _release(
    scores: np.ndarray,
    temperature: float,
    rng: np.random.Generator,
    noise: Callable[[np.ndarray], np.ndarray],
) -> VotingRelease:
    s = np.asarray(scores, dtype=np.float64)
    votes = partition_votes(s, temperature, rng)
    clean = vote_histogram(votes, s.shape[1])
    noisy = clean + noise(clean)
    index = int(rng.choice(np.flatnonzero(noisy == noisy.max())))
    return VotingRelease(
        label_index=index, noisy_counts=noisy, clean_counts=clean, partition_votes=votes
    )


def deterministic_vote(
    scores: np.ndarray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """Noise from a generator seeded by the clean votes: the same query, the same answer."""

    def noise(clean: np.ndarray) -> np.ndarray:
        seed = [int(v) for v in clean.astype(np.int64)]
        return np.random.default_rng(seed).normal(0.0, sigma, size=clean.shape)

    return _release(scores, temperature, rng, noise)


def uniform_vote(
    scores: np.ndarray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """Uniform noise of variance sigma^2: bounded tails."""
    half = sigma * math.sqrt(3.0)
    return _release(scores, temperature, rng, lambda c: rng.uniform(-half, half, size=c.shape))


def correlated_vote(
    scores: np.ndarray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """One N(0, sigma^2) draw added to every count."""
    return _release(scores, temperature, rng, lambda c: np.full(c.shape, rng.normal(0.0, sigma)))


def partial_esa_release(
    partition_embeddings: Any, candidate_embeddings: Any, sigma: float, rng: np.random.Generator
) -> EsaRelease:
    """ESA with noise on the first half of the dimensions only."""
    emb = np.asarray(partition_embeddings, dtype=np.float64)
    cands = np.asarray(candidate_embeddings, dtype=np.float64)
    mean = emb.mean(axis=0)
    noise = rng.normal(0.0, sigma, size=mean.shape)
    noise[mean.shape[0] // 2 :] = 0.0
    noisy = mean + noise
    d = np.linalg.norm(cands - noisy, axis=1)
    return EsaRelease(
        index=nearest(noisy, cands, rng), clean_mean=mean, noisy_mean=noisy, distances=d
    )


@dataclass(frozen=True)
class Fault:
    """One positive control: the attributes it replaces in the server's modules."""

    patches: tuple[tuple[Any, str, Any], ...]
    WARNING: str

    def install(self) -> None:
        """Patch the server's modules in this process (looked up per call)."""
        for module, name, value in self.patches:
            setattr(module, name, value)


TWO_PARTITIONS = Fault(
    ((partitions_mod, "_partition_positions", _overlapping_positions),),
    "every partition also sees the next partition's first exemplar",
)
DETERMINISTIC = Fault(
    ((voting_pipeline, "private_vote", deterministic_vote),),
    "voting noise is seeded by the clean votes: identical queries get identical answers",
)
TAIL_BOUNDED = Fault(
    ((voting_pipeline, "private_vote", uniform_vote),),
    "voting noise is uniform with the claimed variance (no tails)",
)
CORRELATED = Fault(
    ((voting_pipeline, "private_vote", correlated_vote),),
    "voting noise is one draw added to every count (perfectly correlated)",
)
ESA_PARTIAL = Fault(
    ((esa_pipeline, "esa_release", partial_esa_release),),
    "ESA noise covers half of the embedding's dimensions",
)
LEDGER_REMAINING = Fault(
    ((ledger_mod, "remaining_queries", generous_remaining),),
    "the ledger reports one answer more than the budget holds",
)
BATCH_SEEDED_VOTING = Fault(
    ((voting_pipeline, "private_vote", batch_seeded_vote),),
    "voting's randomness has one seed per 8 requests: answers within a batch repeat",
)
BATCH_SEEDED_MOZO = Fault(
    ((mozo_mechanism, "run_mozo", batch_seeded_mozo),),
    "DPS-MOZO's randomness has one seed per 8 requests: answers within a batch repeat",
)
FAULTS = {
    "two_partitions": TWO_PARTITIONS,
    "deterministic": DETERMINISTIC,
    "tail_bounded": TAIL_BOUNDED,
    "correlated": CORRELATED,
    "esa_partial": ESA_PARTIAL,
    "ledger_remaining": LEDGER_REMAINING,
    "batch_seeded_voting": BATCH_SEEDED_VOTING,
    "batch_seeded_mozo": BATCH_SEEDED_MOZO,
}
assert voting_mech.private_vote is not None  # the honest mechanism stays importable
