"""Auditing generation with embedding space aggregation (ESA; paper 000, Sections 3.4, 4.3).

The neighbour pair is built as for private voting (:mod:`..neighbours`): C1 and C0
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
text is nearer the noisy mean (:mod:`.build`, with the release's closed-form rates).

**Where e(y1) and e(y0) come from.** The white-box score needs the signal texts' embeddings
in the server's embedding space: observed on the server where it shows its partitions,
embedded locally otherwise (:mod:`.signals`, before the trials). The source is recorded
in the run's design.

**Contexts.** Each context is budgeted for the queries the audit sends it, so a server in
production configuration (no ``DPICL_ALLOW_UNBUDGETED``) can be audited. A world whose
trials need more than the largest budget a server takes is spread over several identical
contexts (same exemplars, partition seed and mechanism; ``... C<world> #<slot>`` on the
server), as for voting (:func:`dpicl_audit.plan.budgets.context_capacity`). e(y1) and
e(y0) are learnt once, from the first pair (slot 0 of the first epsilon), and stored with
the run's design: every slot's trials, and a resumed run's, use them. The results name the
first pair's contexts.

**Reported privacy figures.** Beside epsilon_emp every setting shows epsilon_theory,
``epsilon_exact`` (the Gaussian mechanism's true epsilon at the worst-case shift 2/T, or 1
with ``sensitivity = "original"``), and ``epsilon_exact_signal``: the exact epsilon for the
shift the canary actually causes when one partition's answer turns from y0 into y1,
``||e(y1) - e(y0)|| / T``. The gap between epsilon_exact and epsilon_exact_signal is
looseness of the analysis (real embeddings never sit 2 apart); the gap between
epsilon_exact_signal and epsilon_emp is weakness of the attack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dpicl_audit.claims import SettingClaims
from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.datasets import LabelledDataset
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.jsontypes import JsonObject, JsonValue
from dpicl_audit.mechanisms.base import SettingRows, TrialAt, ask, needs_internal, require_keys
from dpicl_audit.mechanisms.esa.bootstrap import estimate_esa_bootstrap
from dpicl_audit.mechanisms.esa.build import build_generation_design
from dpicl_audit.mechanisms.esa.design import FloatArray, GenerationDesign
from dpicl_audit.mechanisms.esa.estimates import esa_claims, estimate_esa_trials
from dpicl_audit.mechanisms.esa.facts import EsaFacts
from dpicl_audit.mechanisms.esa.settings import EsaSettings
from dpicl_audit.mechanisms.esa.signals import resolve_signal_embeddings
from dpicl_audit.mechanisms.gaussian import GaussianMechanismAudit, gaussian_setting_claims
from dpicl_audit.plan import AuditPlan
from dpicl_audit.results import SettingResult
from dpicl_audit.store import ContextRecord, TrialRecord

__all__ = ["ESA", "EsaAudit"]


class EsaAudit(GaussianMechanismAudit):
    """ESA: the zero-shot candidate nearest a noisy mean of T partition embeddings."""

    name = "esa"
    settings = EsaSettings
    task = "generation"
    design_type = GenerationDesign
    clean_name = "clean means"
    # e(y1), e(y0) are learnt once, from the first pair; a world whose trials need more budget
    # than one context holds spreads them over identical contexts (queries_per_context, as
    # voting does), whose trials all use them.
    learns_from_contexts = True

    def build_design(self, plan: AuditPlan, dataset: LabelledDataset) -> GenerationDesign:
        return build_generation_design(plan, dataset)

    def summary(self, design: GenerationDesign) -> JsonObject:
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
    ) -> ContextBody:
        body = self.base_body(design, plan, epsilon, world, name=name)
        body["template"] = design.template
        mech = EsaSettings.of(plan)
        body["mechanism"] |= {
            "sensitivity": mech.sensitivity,
            "candidates": mech.candidates,
            "max_tokens": mech.max_tokens,
        }
        return body

    def calls_per_query(self, plan: AuditPlan) -> int:
        return EsaSettings.of(plan).partitions + EsaSettings.of(plan).candidates

    async def prepare(
        self,
        target: AuditTarget,
        design: GenerationDesign,
        plan: AuditPlan,
        contexts: Mapping[int, ContextRecord],
        *,
        bootstrap: bool,
    ) -> GenerationDesign:
        """Learn e(y1), e(y0) once, from the first pair (``contexts``: slot 0 of the first
        epsilon); every context's trials use them (white-box scores and bootstrap need them)."""
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
        out, latency = await ask(
            target, at, design.query, max_tokens=EsaSettings.of(plan).max_tokens
        )
        text = str(out["text"])
        observation: JsonObject = {"text": text}
        score: float | None = None
        if at.white:
            require_keys(out, ("noisy_mean", "sigma"), "POST /v1/debug/generate")
            noisy = _floats(out.get("noisy_mean"), "noisy_mean")
            observation["sigma"] = out.get("sigma")
            if design.signal_embeddings() is not None:
                score = design.score(noisy)
            clean = out.get("clean_mean")
            if clean is not None:
                # The noise itself, for the conformance tests (.estimates.esa_conformance).
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

    def claims_from_json(self, data: Mapping[str, JsonValue]) -> SettingClaims:
        return SettingClaims.from_json(data, EsaFacts.from_json)

    def setting_claims(
        self,
        plan: AuditPlan,
        design: GenerationDesign,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> SettingClaims:
        claims = gaussian_setting_claims(plan, epsilon, contexts, design.layout)
        return esa_claims(plan, design, claims)

    def estimate(self, s: SettingRows) -> SettingResult:
        if s.bootstrap:
            return estimate_esa_bootstrap(s)
        return estimate_esa_trials(s, self.calls_per_query(s.plan))


def _floats(value: Any, name: str) -> FloatArray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError(f"/v1/debug/generate: {name} holds non-numbers") from exc
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise TargetProtocolError(f"/v1/debug/generate: {name} is not a finite vector")
    return arr


ESA = EsaAudit()
