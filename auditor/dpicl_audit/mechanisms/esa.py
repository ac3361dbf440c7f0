"""Auditing generation with embedding space aggregation (ESA; paper 000, Sections 3.4, 4.3).

The neighbour pair is built as for private voting (:mod:`.neighbours`): C1 and C0
hold the same ``partitions x shots`` dialogues in the same order with the same
``partition_seed`` and differ at one position, where C1 holds the canary. The audit turns
free generation into a binary choice between two fixed *signal texts* ``y1`` ("canary
present") and ``y0`` ("absent"), whose embeddings lie far apart (Table 3 of paper 000; the
pairs are built in by name in :data:`SIGNAL_PAIRS`, and a plan may give its own).

Attacks (``plan.attack``, ``plan.threat_model``):

* ``inquery``, black-box: Prompt 3. The query asks for y1 when the canary is in the
  context, y0 when not, and a random one of the two when the context is empty, so ESA's
  zero-shot candidates hold both texts. Decision: the released text is y1.
* ``inquery``, white-box: Prompt 2 through ``/v1/debug/generate``. Score
  ``||m - e(y1)|| - ||m - e(y0)||`` of the noisy mean ``m``; "present" when the score is
  below a threshold chosen on a held-out split (as for voting).
* ``repeat`` (baseline, black-box): Prompt 5, asking to complete the first half of the
  canary dialogue; "present" when the released text contains its second half.
* ``reference-vector`` (baseline, white-box): Prompt 6 with its own canary ("The sun rises
  in the west.") and the reference texts ``["Incorrect statement",]`` and ``[]``.

**Designs** (``plan.design``, resolved before building): ``paper`` is built here (the canary
in one partition of ``shots`` dialogues); ``pivotal`` (the balanced default on a simulator) and
``identical`` (on a real engine) pin the other partitions so the canary's decides which signal
text is nearer the noisy mean (:mod:`.esa_designs`, with the release's closed-form rates).

**Where e(y1) and e(y0) come from.** The white-box score needs the signal texts' embeddings
in the server's embedding space: observed on the server where it shows its partitions,
embedded locally otherwise (:mod:`.esa_signals`, before the trials). The source is recorded
in the run's design.

**Reported privacy figures.** Beside epsilon_emp every setting shows epsilon_theory,
``epsilon_exact`` (the Gaussian mechanism's true epsilon at the worst-case shift 2/T, or 1
with ``sensitivity = "original"``), and ``epsilon_exact_signal``: the exact epsilon for the
shift the canary actually causes when one partition's answer turns from y0 into y1,
``||e(y1) - e(y0)|| / T``. The gap between epsilon_exact and epsilon_exact_signal is
looseness of the analysis (real embeddings never sit 2 apart); the gap between
epsilon_exact_signal and epsilon_emp is weakness of the attack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dpicl_audit.client import AuditTarget
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError, InvalidAuditInput, TargetProtocolError
from dpicl_audit.mechanisms.base import (
    GaussianMechanismAudit,
    TrialAt,
    ask,
    gaussian_setting_meta,
    needs_internal,
)
from dpicl_audit.mechanisms.esa_designs import build_esa_pinned_design
from dpicl_audit.mechanisms.esa_estimates import (
    esa_meta,
    estimate_esa_bootstrap,
    estimate_esa_trials,
)
from dpicl_audit.mechanisms.esa_signals import resolve_signal_embeddings
from dpicl_audit.mechanisms.neighbours import (
    MIN_ORACLE_CHARS,
    STREAM_DESIGN,
    NeighbourPair,
    neighbour_slot,
    pair_from_json,
    pair_to_json,
    pick_exemplars,
    random_canary_text,
)
from dpicl_audit.mechanisms.voting_designs import resolve_design
from dpicl_audit.plan import AuditPlan
from dpicl_audit.prompts import (
    GENERATION_AUDIT_TEMPLATE,
    REFERENCE_PAIR,
    REFERENCE_VECTOR_CANARY,
    REFERENCE_VECTOR_TEMPLATE,
    REPEAT_TEMPLATE,
    SIGNAL_PAIRS,
    generation_blackbox_query,
    generation_whitebox_query,
    reference_vector_query,
    repeat_query,
)
from dpicl_audit.store import ContextRecord, TrialRecord

__all__ = [
    "SIGNAL_PAIRS",
    "EsaAudit",
    "GenerationDesign",
    "build_generation_design",
    "esa_score",
    "signal_pair",
]

FloatArray = npt.NDArray[np.float64]


def signal_pair(plan: AuditPlan) -> tuple[str, str, str]:
    """(name, y1, y0) of the plan: its own pair, or a built-in one by name."""
    g = plan.generation
    if g.y1 is not None and g.y0 is not None:
        return "custom", g.y1.strip(), g.y0.strip()
    y1, y0 = SIGNAL_PAIRS[g.signal]
    return g.signal, y1, y0


def _norm_text(text: str) -> str:
    return " ".join(text.split()).casefold()


def esa_score(noisy_mean: npt.ArrayLike, e1: npt.ArrayLike, e0: npt.ArrayLike) -> float:
    """The white-box statistic ``||m - e(y1)|| - ||m - e(y0)||`` (lower: "present")."""
    m = np.asarray(noisy_mean, dtype=np.float64)
    a, b = np.asarray(e1, dtype=np.float64), np.asarray(e0, dtype=np.float64)
    if m.shape != a.shape or m.shape != b.shape:
        raise InvalidAuditInput(
            f"noisy mean {m.shape} and signal embeddings {a.shape}, {b.shape} differ in shape"
        )
    return float(np.linalg.norm(m - a) - np.linalg.norm(m - b))


@dataclass(frozen=True, slots=True)
class GenerationDesign(NeighbourPair):
    """The ESA neighbour pair, the audit query and the signal texts (JSON round-trip)."""

    attack: str
    canary_kind: str
    template: str
    position: int
    partition_seed: int
    canary: Example
    replacement: Example
    exemplars_c0: tuple[Example, ...]
    query: str
    y1: str
    y0: str
    signal: str
    repeat_suffix: str | None = None
    e1: tuple[float, ...] | None = None
    e0: tuple[float, ...] | None = None
    embeddings_source: str | None = None
    layout: str = "paper"  # "paper", "pivotal" or "identical" (.esa_designs)

    @property
    def positive(self) -> str:
        return self.y1

    @property
    def negative(self) -> str:
        return self.y0

    def decide_text(self, text: str) -> int:
        """Black-box rule: 1 ("present") when the released text is y1 (Section 3.4; the
        identical design: its first line, as a model continues past the copied output); for
        the Repeat baseline, when it contains the canary's hidden second half."""
        if self.attack == "repeat":
            return int(bool(self.repeat_suffix) and _norm_text(self.repeat_suffix or "")
                       in _norm_text(text))  # fmt: skip
        return int(self.signal_text(text) == self.y1)

    def signal_text(self, text: str) -> str:
        """The part of a released text compared with y1 and y0."""
        t = text.strip()
        return t.split("\n", 1)[0].strip() if self.layout == "identical" else t

    def signal_embeddings(self) -> tuple[FloatArray, FloatArray] | None:
        if self.e1 is None or self.e0 is None:
            return None
        return np.asarray(self.e1, dtype=np.float64), np.asarray(self.e0, dtype=np.float64)

    def score(self, noisy_mean: npt.ArrayLike) -> float:
        emb = self.signal_embeddings()
        if emb is None:
            raise InvalidAuditInput("the signal embeddings e(y1), e(y0) are not known yet")
        return esa_score(noisy_mean, emb[0], emb[1])

    def signal_distance(self) -> float | None:
        """||e(y1) - e(y0)||, when the embeddings are known."""
        emb = self.signal_embeddings()
        return None if emb is None else float(np.linalg.norm(emb[0] - emb[1]))

    def with_embeddings(self, e1: FloatArray, e0: FloatArray, source: str) -> GenerationDesign:
        return replace(
            self,
            e1=tuple(float(x) for x in e1),
            e0=tuple(float(x) for x in e0),
            embeddings_source=source,
        )

    def to_json(self) -> dict[str, Any]:
        return pair_to_json(self) | {"design_kind": "generation"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GenerationDesign:
        d = pair_from_json(data)
        for key in ("e1", "e0"):
            if d.get(key) is not None:
                d[key] = tuple(float(x) for x in d[key])
        return cls(**d)


def build_generation_design(plan: AuditPlan, dataset: LabelledDataset) -> GenerationDesign:
    """Draw the canary, replacement, exemplars, position and seed; write the audit query.

    ``plan.design`` must be resolved (``auto`` builds the pivotal design, a simulator's)."""
    layout = resolve_design(plan, simulator=True)
    if layout != "paper":
        return build_esa_pinned_design(plan, dataset, layout, signal_pair(plan))
    rng = np.random.default_rng([plan.seed, STREAM_DESIGN])
    k = plan.mechanism.n_exemplars
    order = rng.permutation(len(dataset))
    examples = [dataset.examples[int(i)] for i in order]
    name, y1, y0 = signal_pair(plan)
    if plan.attack == "reference-vector":
        name, (y1, y0) = REFERENCE_PAIR, SIGNAL_PAIRS[REFERENCE_PAIR]
        canary_text, canary_out, pool = REFERENCE_VECTOR_CANARY, None, examples
    elif plan.canary == "random":
        canary_text, canary_out, pool = random_canary_text(rng), None, examples
    else:
        canary_text, canary_out, pool = examples[0].input, examples[0].output, examples[1:]
    if len(canary_text.strip()) < MIN_ORACLE_CHARS:
        raise DatasetError(f"canary text {canary_text!r} is too short to be named in a query")

    suffix: str | None = None
    if plan.attack == "repeat":
        words = canary_text.split()
        cut = max(1, len(words) // 2)
        prefix, suffix = " ".join(words[:cut]), " ".join(words[cut:])
        template, query = REPEAT_TEMPLATE, repeat_query(prefix)
    elif plan.attack == "reference-vector":
        template, query = REFERENCE_VECTOR_TEMPLATE, reference_vector_query(canary_text)
    elif plan.threat_model == "white-box":
        template, query = GENERATION_AUDIT_TEMPLATE, generation_whitebox_query(canary_text, y1, y0)
    else:
        template, query = GENERATION_AUDIT_TEMPLATE, generation_blackbox_query(canary_text, y1, y0)

    chosen = pick_exemplars(
        pool, canary_text=canary_text, query=query, k=k, dataset=dataset, exclude=(y1,)
    )
    position, partition_seed = neighbour_slot(plan, rng, k)
    replacement = chosen[position]
    if canary_out is None or plan.canary == "mislabeled":
        canary_out = replacement.output  # a summary of another dialogue
    return GenerationDesign(
        attack=plan.attack,
        canary_kind=plan.canary,
        template=template,
        position=position,
        partition_seed=partition_seed,
        canary=Example(canary_text, canary_out),
        replacement=replacement,
        exemplars_c0=tuple(chosen),
        query=query,
        y1=y1,
        y0=y0,
        signal=name,
        repeat_suffix=suffix,
    )


class EsaAudit(GaussianMechanismAudit):
    """ESA: the zero-shot candidate nearest a noisy mean of T partition embeddings."""

    name = "esa"
    task = "generation"
    design_type = GenerationDesign
    clean_name = "clean means"

    def build_design(self, plan: AuditPlan, dataset: LabelledDataset) -> GenerationDesign:
        return build_generation_design(plan, dataset)

    def summary(self, design: GenerationDesign) -> dict[str, Any]:
        return self.neighbour_summary(design) | {
            "labels": [design.y1, design.y0],
            "positive": design.y1,
            "negative": design.y0,
            "signal": design.signal,
            "signal_distance": design.signal_distance(),
            "embeddings_source": design.embeddings_source,
            "query": design.query,
            "design": design.layout,
        }

    def context_body(
        self, design: GenerationDesign, plan: AuditPlan, epsilon: float, world: int, *, name: str
    ) -> dict[str, Any]:
        body = self.base_body(design, plan, epsilon, world, name=name)
        body["template"] = design.template
        mech = plan.mechanism
        body["mechanism"] |= {
            "sensitivity": mech.sensitivity,
            "candidates": mech.candidates,
            "max_tokens": mech.max_tokens,
        }
        return body

    def calls_per_query(self, plan: AuditPlan) -> int:
        return plan.mechanism.partitions + plan.mechanism.candidates

    async def prepare(
        self,
        target: AuditTarget,
        design: GenerationDesign,
        plan: AuditPlan,
        contexts: Mapping[int, ContextRecord],
        *,
        bootstrap: bool,
    ) -> GenerationDesign:
        """Learn e(y1), e(y0) once (white-box scores and bootstrap need them)."""
        needed = bootstrap or plan.threat_model == "white-box"
        if design.signal_embeddings() is not None:
            return design
        if not needed and plan.generation.embeddings == "server":
            return design
        return await resolve_signal_embeddings(target, design, plan, contexts)

    async def trial(
        self, target: AuditTarget, design: GenerationDesign, plan: AuditPlan, at: TrialAt
    ) -> TrialRecord:
        """One ESA audit query and what it observed."""
        out, latency = await ask(target, at, design.query, max_tokens=plan.mechanism.max_tokens)
        text = str(out["text"])
        observation: dict[str, Any] = {"text": text}
        score: float | None = None
        if at.white:
            noisy = _floats(out.get("noisy_mean"), "noisy_mean")
            observation["sigma"] = out.get("sigma")
            if design.signal_embeddings() is not None:
                score = design.score(noisy)
            clean = out.get("clean_mean")
            if clean is not None:
                # The noise itself, for the conformance tests (mechanisms.conformance_checks).
                c = _floats(clean, "clean_mean")
                observation["residual"] = (noisy - c).tolist()
                observation["residual_ss"] = float(np.sum((noisy - c) ** 2))
                observation["dim"] = int(noisy.size)
            if clean is not None and at.need_clean:
                observation["clean_mean"] = c.tolist()
                texts = out.get("partition_texts")
                if isinstance(texts, list):
                    observation["partition_texts"] = [str(t) for t in texts]
            elif at.need_clean:
                raise needs_internal("/v1/debug/generate", "clean_mean")
        return at.record(design.query, observation, design.decide_text(text), latency, score)

    def setting_meta(
        self,
        plan: AuditPlan,
        design: GenerationDesign,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> dict[str, Any]:
        meta, _mech = gaussian_setting_meta(plan, epsilon, contexts)
        return esa_meta(plan, design, meta, meta["sigma"])

    def estimate(
        self,
        plan: AuditPlan,
        design: GenerationDesign,
        k: int,
        rows: Sequence[TrialRecord],
        meta: dict[str, Any],
        *,
        bootstrap: bool,
    ) -> dict[str, Any]:
        if bootstrap:
            return estimate_esa_bootstrap(plan, design, k, rows, meta)
        return estimate_esa_trials(plan, design, k, rows, meta, self.calls_per_query(plan))


def _floats(value: Any, name: str) -> FloatArray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError(f"/v1/debug/generate: {name} holds non-numbers") from exc
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise TargetProtocolError(f"/v1/debug/generate: {name} is not a finite vector")
    return arr


ESA = EsaAudit()
