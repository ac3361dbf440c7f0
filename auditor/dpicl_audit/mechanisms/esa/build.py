"""Building ESA's neighbour designs, and the released candidate's closed-form rates.

``paper`` (paper 000's design: the canary in one partition of ``shots`` exemplars, the others
answering y0: :func:`build_generation_design`), ``pivotal`` and ``identical``
(docs/auditing.md, "ESA: the balanced design"): one exemplar per partition, the other
``T - 1`` partitions pinned so that ``m`` answer y1 and ``m`` answer y0 (T = 2m + 1;
:func:`pivotal_design`'s split for even T), so the canary's partition decides which signal
text is nearer the noisy mean.

**The black-box release.** Let ``e1, e0`` be the (unit) embeddings of y1, y0,
``D = ||e1 - e0||``, and a clean mean ``c = (a e1 + b e0) / T`` (a + b = T partitions answer
y1 / y0). With both texts among the zero-shot candidates, ESA releases y1 exactly when the
noisy mean ``c + N(0, sigma^2 I)`` is nearer e1, i.e. when its projection on
``u = (e1 - e0) / D`` beyond the midpoint ``(e1 + e0) / 2`` is positive. That projection of
``c`` is ``(a - b) D / (2T)`` (use ``<e1, e1 - e0> = D^2 / 2``), and the noise's projection is
``N(0, sigma^2)``, so::

    P(release y1 | gap g = a - b) = Phi(g D / (2 T sigma)).

The canary turns one partition's answer from y1 (C1) into y0 (C0): ``g1 = g0 + 2``, and
``Phi^-1(TPR) - Phi^-1(FPR) = D / (T sigma)``: the Gaussian mechanism's mu at the canary's
actual shift ``D / T`` (epsilon_exact_signal), whatever the offset. The balanced split
(g1 = 1, g0 = -1) puts both rates mid-range. The paper's design has ``g1 = 2 - T``.

Zero-shot candidates: Prompt 3 asks for "randomly y1 or y0" when the context is empty, so
each of the ``T_cand`` candidates is y1 or y0 with probability 1/2 (the oracle's fair coin);
with probability ``2^-T_cand`` all are y1 (released in both worlds) and as often all are y0::

    P(y1) = 2^-T_cand + (1 - 2^(1 - T_cand)) Phi(g D / (2 T sigma)).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from scipy import special

from dpicl_audit.claims import SettingClaims
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError, InvalidPlan
from dpicl_audit.estimators.label_release import binary_release_epsilon, pivotal_design
from dpicl_audit.mechanisms.esa.design import GenerationDesign, signal_pair
from dpicl_audit.mechanisms.esa.facts import EsaFacts
from dpicl_audit.mechanisms.esa.settings import EsaSettings
from dpicl_audit.mechanisms.neighbours import (
    MIN_ORACLE_CHARS,
    STREAM_DESIGN,
    neighbour_slot,
    pick_exemplars,
    random_canary_text,
    resolve_design,
)
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

__all__ = [
    "ESA_IDENTICAL_TEMPLATE",
    "build_esa_pinned_design",
    "build_generation_design",
    "esa_design_gaps",
    "esa_release_rates",
    "identical_template",
]

#: The identical-text design's template: the two signal texts named (so zero-shot candidates
#: can be either), then the demonstrations and the query (a model copies the output of the
#: identical demonstration). ``{y1}``/``{y0}`` are filled in by the auditor.
ESA_IDENTICAL_TEMPLATE = (
    'Reply with one of "{y1}" or "{y0}".\n\n{{exemplars}}\n\nInput: {{query}}\nOutput:'
)


def identical_template(y1: str, y0: str) -> str:
    """The identical design's context template for the signal texts y1, y0."""
    return ESA_IDENTICAL_TEMPLATE.format(y1=y1, y0=y0)


def esa_design_gaps(layout: str, partitions: int) -> tuple[int, int]:
    """Clean gaps ``(#y1 - #y0)`` of C1 and C0 that the design intends."""
    t = int(partitions)
    if layout == "paper":
        return 2 - t, -t

    d = pivotal_design(t)
    return d.gap_with, d.gap_without


def esa_release_rates(
    gaps: tuple[int, int],
    distance: float,
    partitions: int,
    sigma: float,
    candidates: int | None = None,
) -> tuple[float, float]:
    """``(P(y1 | C1), P(y1 | C0))`` of the black-box release (module docstring); with
    ``candidates=None`` both texts are assumed among the candidates (as the bootstrap does)."""
    if not sigma > 0.0 or not distance >= 0.0:
        raise InvalidPlan(f"need sigma > 0 and a distance >= 0, got {sigma!r}, {distance!r}")
    scale = float(distance) / (2.0 * partitions * sigma)
    both = 1.0 if candidates is None else 1.0 - 2.0 ** (1 - int(candidates))
    only_y1 = 0.0 if candidates is None else 2.0 ** -int(candidates)
    p1, p0 = (only_y1 + both * float(special.ndtr(g * scale)) for g in gaps)
    return p1, p0


def _made_up_phrase(rng: np.random.Generator) -> str:
    return random_canary_text(rng, words=3)


def build_esa_pinned_design(
    plan: AuditPlan, dataset: LabelledDataset, layout: str, signal: tuple[str, str, str]
) -> GenerationDesign:
    """A pivotal canary for ESA: one exemplar per partition, the other ``T - 1`` pinned.

    * ``pivotal`` (Prompt 3, or Prompt 2 white-box): a partition answers y1 when it holds the
      queried text x; the pinned y1 partitions hold a copy of x, the pinned y0 ones other
      dialogues; the canary partition holds x in C1 and another dialogue in C0.
    * ``identical``: every partition holds the same made-up text x; y1, y0 are made-up
      three-word phrases (unless the plan gives its own pair); the template names both and
      the query is x; the canary partition holds (x, y1) in C1 and (x, y0) in C0.
    """

    rng = np.random.default_rng([plan.seed, STREAM_DESIGN, 3 if layout == "pivotal" else 4])
    t = EsaSettings.of(plan).partitions
    if t < 2:
        raise InvalidPlan(f"the {layout} design needs at least 2 partitions, got {t}")
    pinned = pivotal_design(t).other_labels  # 0: answers y1, 1: answers y0
    position, partition_seed = neighbour_slot(plan, rng, t)
    if position >= t:
        raise InvalidPlan(
            f"neighbour.position {position} is outside the {layout} design's {t} exemplars "
            "(one per partition)"
        )
    name, y1, y0 = signal
    order = rng.permutation(len(dataset))
    if layout == "identical":
        x = random_canary_text(rng)
        if plan.generation.y1 is None:
            name, y1 = "made-up", _made_up_phrase(rng)
            y0 = y1
            while y0 == y1:
                y0 = _made_up_phrase(rng)
        template, query = identical_template(y1, y0), x
        canary, replacement = Example(x, y1), Example(x, y0)
        others = [Example(x, y1 if j == 0 else y0) for j in pinned]
    else:
        examples = [dataset.examples[int(i)] for i in order]
        if plan.canary == "random":
            x, pool = random_canary_text(rng), examples
        else:
            x, pool = examples[0].input, examples[1:]
        if plan.threat_model == "white-box":
            query = generation_whitebox_query(x, y1, y0)
        else:
            query = generation_blackbox_query(x, y1, y0)
        template = GENERATION_AUDIT_TEMPLATE
        n_y0 = sum(1 for j in pinned if j == 1)
        texts = pick_exemplars(
            pool, canary_text=x, query=query, k=n_y0 + t, dataset=dataset, exclude=(y1,)
        )
        replacement = texts[0]
        canary = Example(x, replacement.output)  # natural: a summary of another dialogue
        outputs = iter(e.output for e in texts[1 + n_y0 :])
        no_texts = iter(texts[1 : 1 + n_y0])
        others = [
            Example(x, next(outputs)) if j == 0 else next(no_texts) for j in pinned
        ]  # fmt: skip
    if len(x.strip()) < MIN_ORACLE_CHARS:
        raise DatasetError(f"canary text {x!r} is shorter than {MIN_ORACLE_CHARS} characters")
    exemplars = [*others[:position], replacement, *others[position:]]
    return GenerationDesign(
        attack=plan.attack,
        canary_kind=plan.canary,
        template=template,
        position=position,
        partition_seed=partition_seed,
        canary=canary,
        replacement=replacement,
        exemplars_c0=tuple(exemplars),
        query=query,
        y1=y1,
        y0=y0,
        signal=name,
        layout=layout,
    )


def release_epsilon_claims(claims: SettingClaims, candidates: int) -> SettingClaims:
    """The claims with the design's clean gaps, its ``release_rates`` (fair-coin candidates)
    and ``epsilon_exact_release`` (the exact epsilon of the released candidate: the
    black-box classical bound's ceiling), where the noise and the signal are known."""
    facts, sigma = claims.own(EsaFacts), claims.sigma
    distance, partitions = facts.signal_distance, facts.partitions
    if distance is None or sigma is None or distance <= 0.0:
        return claims

    gaps = esa_design_gaps(facts.design, partitions)
    p1, p0 = esa_release_rates(gaps, distance, partitions, sigma, candidates)
    eps = binary_release_epsilon(p1, p0, claims.delta)
    return replace(
        claims,
        facts=replace(facts, design_gaps=gaps),
        release_rates=(p1, p0),
        epsilon_exact_release=eps if math.isfinite(eps) else None,
        # Written as null where the release has no finite epsilon (as it always was).
        nulls=claims.nulls | {"epsilon_exact_release"},
    )


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
