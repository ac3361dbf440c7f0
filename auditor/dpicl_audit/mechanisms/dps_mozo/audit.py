"""Auditing DPS-MOZO (paper 004, Algorithm 1) in the audit pipeline.

* **Neighbours.** C1 holds the canary ``(x_c, s1)`` at position ``i``; C0 the replacement
  ``(x_r, s0)`` there, everything else equal (replace-one; the exemplars' *outputs* are
  private). ``x_c`` asks which colour "is present" in record ``7F3Q``, quoting the two
  signal words (``plan.mozo.signals``, default ``red`` then ``blue``); ``x_r`` asks the same
  about another record. The other exemplars are drawn from the dataset (``dialogsum-mini``).
* **Query.** ``x_c`` itself: in C1 the canary's one-shot prompt shows ``x_c`` answered with
  s1 right before the query, which pushes the first token to s1; in C0 the replacement's
  shot shows the same question answered s0. The zero-shot prompt sees both words quoted, so
  both are in its top-k (Line 5: tokens outside it can never be released).
* **Guarantee** (``MozoSettings.of(plan).guarantee``, sent as ``mechanism.guarantee``).
  ``"proven"`` (the default, as on the server): the configured (epsilon, delta) is a true
  claim (each token pure ``per_token_epsilon``-DP, docs/privacy.md). ``"paper"``: the
  paper's RDP-derived figure, which is **nominal** (its per-token bound, Theorem B.3, is
  false).
* **Observation.** Black-box: the released text; decision 1 when it starts with s1 (case,
  leading blanks and quotes ignored). White-box (``/v1/debug/generate``): the per-token
  internals. Proven mode: at ``internal``, :mod:`.check`
  recomputes from the reported probabilities each token's radius ``max |log q_i - log p0|``
  (claim: ``<= max_log_ratio``) and realised worst case ``max |log P - log P_i|`` (claim:
  ``<= per_token_epsilon``); only those summaries are logged, plus the first token's shots
  and released distribution, so that C1 and C0 answers drawn with the same shots (the
  replace-one pair itself) are compared too (:mod:`.findings`). Paper mode: the
  lambdas and divergences each shot reached and, at ``internal``, the exact per-shot
  divergences of the released distribution against ``4 beta alpha``.
* **Conformance.** Black-box and white-box, every mode: each world's released texts, in trial
  order, against exchangeability (:mod:`dpicl_audit.estimators.exchangeable`): every answer
  draws fresh randomness, so the order of the answers to one query carries no information,
  whatever the model; a server whose randomness is shared between answers (seeded by the
  clock, cached) releases runs of identical texts and is NONCONFORMING (independence). No
  release *distribution* is predicted black-box (the model's is unknown). White-box, proven
  mode, ``internal``: the released first token of each trial against the distribution the
  server reports it was drawn from (:mod:`dpicl_audit.estimators.draws`, a randomised PIT).
* **Verdicts.** Proven mode: ``epsilon_emp`` is the classical lower bound (assumption-free;
  the GDP figure assumes a Gaussian trade-off, which a pure-DP claim is not), compared with
  the claimed epsilon: above it is a VIOLATION; a white-box token outside either bound is a
  VIOLATION naming the trial and token. Paper mode: ``epsilon_emp`` is the larger of the GDP
  and classical lower bounds, worded against the nominal claim. No exact epsilon of the
  release either way; proven mode's claim is checked deterministically against the reported
  eps0 (:mod:`.claim`: the exact epsilon of ``queries x max_tokens`` tokens at that eps0
  above the claim is a BUG, stored as ``calibration_departure``).
* **Contexts.** A DPS-MOZO context answers ``queries_per_context`` queries and is then
  ``budget_exhausted``, so trial ``j`` of a world goes to that world's context
  ``j // queries_per_context`` (:func:`dpicl_audit.plan.schedule.context_slots`), created when
  first needed; a context found spent on resume (a query answered but never logged) is
  replaced by a fresh identical one. Spent contexts are deleted when the run completes.
* **Bootstrap.** None (there is no clean internal state to resample).

On the oracle simulator DPS-MOZO decodes the oracle's pseudo-random logits, not its rules,
so the audit measures about nothing there (it checks the plumbing); the results say so.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpicl_audit.claims import SettingClaims, number
from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.context_info import MechanismInfo
from dpicl_audit.datasets import LabelledDataset
from dpicl_audit.errors import InvalidAuditInput, TargetProtocolError
from dpicl_audit.estimators.conformance import ConformanceTest
from dpicl_audit.estimators.draws import Draw, sampling_tests
from dpicl_audit.estimators.exchangeable import order_can_inform
from dpicl_audit.estimators.gdp import gdp_epsilon
from dpicl_audit.jsontypes import (
    JsonObject,
    JsonValue,
    json_float,
    json_int,
    json_list,
    json_object,
)
from dpicl_audit.mechanisms.base import (
    MechanismAudit,
    SettingRows,
    TrialAt,
    ask,
    estimate_trials,
    exemplar_dicts,
)
from dpicl_audit.mechanisms.dps_mozo.check import token_internals
from dpicl_audit.mechanisms.dps_mozo.claim import mozo_claim_departure, per_token_bound
from dpicl_audit.mechanisms.dps_mozo.design import MozoDesign, decide, mozo_design
from dpicl_audit.mechanisms.dps_mozo.facts import MozoFacts
from dpicl_audit.mechanisms.dps_mozo.findings import (
    divergence_check,
    ratio_check,
    without_signal,
)
from dpicl_audit.mechanisms.dps_mozo.legacy import upgrade_run
from dpicl_audit.mechanisms.dps_mozo.settings import MozoSettings
from dpicl_audit.mechanisms.trial_estimates import Finish, finish_conformance, released_answers
from dpicl_audit.plan import AuditPlan
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import ContextRecord, RunRecord, TrialRecord
from dpicl_audit.verdicts import Status, Verdict, for_the_family, verdict

__all__ = ["MOZO", "MozoAudit"]


def _starts_with(text: str, signals: tuple[str, str]) -> str:
    if decide(text, signals[0]):
        return "signal1"
    return "signal0" if decide(text, signals[1]) else "other"


class MozoAudit(MechanismAudit):
    """DPS-MOZO: tokens sampled from the product of mixed one-shot distributions."""

    name = "dps-mozo"
    settings = MozoSettings
    task = "generation"
    design_type = MozoDesign
    has_bootstrap = False

    def build_design(self, plan: AuditPlan, dataset: LabelledDataset) -> MozoDesign:
        return mozo_design(plan, dataset)

    def summary(self, design: MozoDesign) -> JsonObject:
        return {
            "attack": design.attack,
            "canary_kind": "signal",
            "canary": design.canary.input,
            "canary_label": design.canary.output,
            "position": design.position,
            "labels": list(design.signals),
            "positive": design.signals[0],
            "negative": design.signals[1],
            "query": design.query,
        }

    def context_body(
        self, design: MozoDesign, plan: AuditPlan, epsilon: float, world: int, *, name: str
    ) -> ContextBody:
        m = MozoSettings.of(plan)
        mechanism: JsonObject = {
            "name": self.name,
            "guarantee": m.guarantee,
            "epsilon": float(epsilon),
            "delta": m.delta,
            "n_shots": m.n_shots or m.exemplars,
            "top_k": m.top_k,
            "max_tokens": m.max_tokens,
            "queries": m.queries_per_context,
        }
        if m.alpha is not None:
            mechanism["alpha"] = m.alpha
        return {
            "name": name,
            "task": self.task,
            "template": design.template,
            "exemplars": exemplar_dicts(design.exemplars(world)),
            "mechanism": mechanism,
        }

    def ingredients(self, design: MozoDesign, plan: AuditPlan) -> Ingredients:
        """Contexts limited by a count of queries (``queries``), not a budget: the ledger is
        probed under concurrency only; the audit query; ``max_tokens``, which the context's
        calibration composes; and in the proven mode the per-token bound from the contexts'
        reported eps0 (:func:`.claim.per_token_bound`), probed position by position after
        the surface (the paper mode claims none per token)."""
        m = MozoSettings.of(plan)

        def hold(body: ContextBody, epsilon: float, answers: int) -> ContextBody:
            return body | {"mechanism": dict(body["mechanism"]) | {"queries": answers}}

        per_token = (
            per_token_bound
            if m.guarantee == "proven"
            else "the paper mode claims no per-token bound: the positions were not probed"
        )
        kit = super().ingredients(design, plan)
        return replace(
            kit, hold=hold, query=design.query, token_limit=m.max_tokens, per_token=per_token
        )

    def upgrade_run(self, run: RunRecord) -> RunRecord | None:
        return upgrade_run(run)  # the old separate audit's logs (.legacy)

    def calls_per_query(self, plan: AuditPlan) -> int:
        return MozoSettings.of(plan).exemplars + 1  # |D| one-shot prompts and the zero-shot one

    def claims_per_setting(self, design: Any, threat_models: Sequence[str]) -> int:
        # The black-box figure only: the white-box findings (mozo_findings) are direct
        # checks of the logged internals, not statistical tests.
        return 1

    def queries_per_context(self, plan: AuditPlan) -> int | None:
        return MozoSettings.of(plan).queries_per_context

    async def trial(
        self, target: AuditTarget, design: MozoDesign, plan: AuditPlan, at: TrialAt
    ) -> TrialRecord:
        _check_guarantee(at.context, MozoSettings.of(plan).guarantee)
        out, latency = await ask(
            target, at, design.query, max_tokens=MozoSettings.of(plan).max_tokens
        )
        text = str(out["text"])
        cost = json_object(out.get("cost"))
        observation: JsonObject = {
            "text": text,
            "starts_with": _starts_with(text, design.signals),
            "cost_epsilon": cost.get("epsilon"),
        }
        if at.white:
            observation |= token_internals(out, MozoSettings.of(plan).guarantee)
        return at.record(design.query, observation, design.decide_text(text), latency)

    def claims_from_json(self, data: Mapping[str, JsonValue]) -> SettingClaims:
        return SettingClaims.from_json(data, MozoFacts.from_json)

    def setting_claims(
        self,
        plan: AuditPlan,
        design: MozoDesign,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> SettingClaims:
        setting = plan.setting_key(epsilon)
        mine = [c for (s, _w), c in contexts.items() if s.split("#")[0] == setting]
        c1 = contexts.get((setting, 1)) or (mine[0] if mine else None)
        mech: MechanismInfo = c1.info.get("mechanism", {}) if c1 is not None else {}
        alpha, beta = mech.get("alpha"), mech.get("beta")
        proven = MozoSettings.of(plan).guarantee == "proven"
        eps0, per_token = mech.get("max_log_ratio"), mech.get("per_token_epsilon")
        if proven and c1 is not None and (eps0 is None or per_token is None):
            raise TargetProtocolError(
                f"context {c1.context_id} reports no max_log_ratio/per_token_epsilon: it is "
                "not in DPS-MOZO's proven mode"
            )
        # The claim against the reported eps0 (issue 35, item 4; mechanisms/dps_mozo/claim.py).
        from_eps0, weaker = (
            mozo_claim_departure(mech, epsilon, MozoSettings.of(plan).exemplars)
            if proven and eps0 is not None
            else (None, None)
        )
        facts = MozoFacts(
            contexts_used=len(mine),
            guarantee=MozoSettings.of(plan).guarantee,
            alpha=number(alpha),
            beta=number(beta),
            max_log_ratio=None if eps0 is None else float(eps0),
            per_token_epsilon=None if per_token is None else float(per_token),
            per_token_bound=(
                (None if per_token is None else float(per_token))
                if proven
                else (None if alpha is None or beta is None else 4 * beta * alpha)
            ),
            epsilon_from_eps0=from_eps0,
            calibration_departure=weaker,
        )
        return SettingClaims(
            setting=setting,
            epsilon_theory=epsilon,
            delta=float(mech.get("delta") or plan.mechanism.delta),
            context_ids={
                f"C{w}": sorted(
                    c.context_id
                    for (s, ww), c in contexts.items()
                    if ww == w and s.split("#")[0] == setting
                )
                for w in (1, 0)
            },
            facts=facts,
        )

    def estimate(self, s: SettingRows) -> SettingResult:
        plan, k, rows, claims = s.plan, s.k, s.rows, s.claims
        if s.bootstrap:
            raise InvalidAuditInput("DPS-MOZO has no bootstrap audit; use a run")
        proven = MozoSettings.of(plan).guarantee == "proven"
        out = estimate_trials(
            plan,
            k,
            rows,
            claims,
            calls_per_query=self.calls_per_query(plan),
            finish=_verdict_of(nominal=not proven),
        )
        starts: dict[str, dict[str, int]] = {"C1": {}, "C0": {}}
        for r in rows:
            key = starts[f"C{r.world}"]
            start = str(r.observation.get("starts_with"))
            key[start] = key.get(start, 0) + 1
        per_answer = [r.observation.get("cost_epsilon") for r in rows]
        out = out.updated(
            starts_with=starts,
            epsilon_theory_per_answer=next(
                (float(v) for v in per_answer if isinstance(v, int | float)), None
            ),
        )
        seed = zlib.crc32(claims.setting.encode())
        white: list[ConformanceTest] = []
        if plan.threat_model == "white-box":
            facts = claims.own(MozoFacts)
            out = out.updated(white_box=(ratio_check if proven else divergence_check)(rows, facts))
            if proven:
                # The released first tokens against the distributions reported for them
                # (estimators.draws): a server that reports the DP distribution but
                # releases something else is NONCONFORMING.
                white = sampling_tests(first_token_draws(rows), np.random.default_rng(seed))
        answers = released_answers(rows, "text")
        if not white and not any(order_can_inform(a) for a in answers.values()):
            return out  # nothing to test (no conformance block, as before issue 27's test)
        return finish_conformance(out, claims, [], white, answers=answers, seed=[plan.seed, seed])


def first_token_draws(rows: Sequence[TrialRecord]) -> list[Draw]:
    """Each white-box trial's released first token and the distribution reported for it
    (its ``first_token``: the top-k ids and ``product_probs``; logged at ``internal``)."""
    draws = []
    for r in rows:
        first, tokens = r.observation.get("first_token"), json_list(r.observation.get("tokens"))
        if not isinstance(first, Mapping) or not tokens or not first.get("top_ids"):
            continue
        token = json_object(tokens[0]).get("token_id")
        if token is None:
            continue
        ids = tuple(json_int(i) for i in json_list(first["top_ids"]))
        probs = tuple(json_float(p) for p in json_list(first["product_probs"]))
        if len(ids) == len(probs):
            draws.append(Draw(json_int(token), ids, probs))
    return draws


def _check_guarantee(context: ContextRecord, guarantee: str) -> None:
    """Refuse a context whose mechanism record is not in the audited mode (a server from
    before the proven mode reports no guarantee: it ran the paper's)."""
    mech = context.info.get("mechanism")
    got = (mech.get("guarantee") or "paper") if isinstance(mech, Mapping) else None
    if got != guarantee:
        raise TargetProtocolError(
            f"context {context.context_id} has DPS-MOZO guarantee {got!r}, the audit asked "
            f"for {guarantee!r} (--guarantee)"
        )


def _verdict_of(*, nominal: bool) -> Finish:
    """epsilon_emp and its verdict: proven mode reads the classical lower bound against the
    true claim; paper mode the larger of the GDP and classical figures against the nominal
    one. A VIOLATION holds for the run's tests together (verdicts.for_the_family)."""

    def finish(est: Estimate, claims: SettingClaims) -> Estimate:
        theory, delta = claims.epsilon_theory, claims.delta

        def emp(mu: float, classical: float) -> float:
            return max(gdp_epsilon(mu, delta) if nominal else 0.0, classical, 0.0)

        def judge(mu: float, classical: float) -> Verdict:
            return verdict(emp(mu, classical), theory, None, nominal=nominal)

        mu, classical = float(est.get("mu_lower")), float(est.get("epsilon_lower_classic"))
        basis = {} if nominal else {"epsilon_emp_basis": "classical"}
        est = est.updated(epsilon_emp=emp(mu, classical), **basis)
        again = lambda fw: judge(fw.mu_lower, fw.epsilon_lower_classic)  # noqa: E731
        found = without_signal(for_the_family(judge(mu, classical), est, claims, again), est)
        weaker = claims.own(MozoFacts).calibration_departure
        if weaker and found.status is not Status.VIOLATION:
            # Deterministic, beside the statistics: no trial can make a weak calibration right.
            found = Verdict(status=Status.BUG, message=f"BUG: {weaker}", exceeds_exact=True)
        return est.updated(verdict=found)

    return finish


MOZO = MozoAudit()
