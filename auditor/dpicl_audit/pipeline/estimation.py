"""Estimation: a run's results from its trial log, generic over the audited mechanism.

For every epsilon of the plan, the mechanism module supplies the setting's claims
(epsilon_theory, epsilon_exact, noise, its own facts: a :class:`~dpicl_audit.claims.
SettingClaims` from :meth:`~dpicl_audit.mechanisms.base.MechanismAudit.setting_claims`) and
the estimates from the logged rows (real trials, or the clean rows of a bootstrap run:
:meth:`~dpicl_audit.mechanisms.base.MechanismAudit.estimate`); each estimate carries its
verdict (:mod:`dpicl_audit.verdicts`). The estimators themselves live in
:mod:`dpicl_audit.estimators` and :mod:`dpicl_audit.estimators.bootstrap`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dpicl_audit.claims import Family
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.channels import channel_alpha, is_refusal, refusal_test, timing_test
from dpicl_audit.estimators.trial_budget import needs_from_bootstrap
from dpicl_audit.jsontypes import JsonMapping, json_object
from dpicl_audit.mechanisms.base import Design, SettingRows
from dpicl_audit.mechanisms.registry import get_mechanism, upgraded_run
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import CLEAN_SETTING
from dpicl_audit.results import Estimate, RunResult, SettingResult, jsonable
from dpicl_audit.store import RunRecord, TrialStore
from dpicl_audit.verdicts import Status, Verdict

__all__ = ["estimate_run", "estimate_setting", "load_run", "run_design", "run_plan"]


def load_run(store: TrialStore, run_id: str) -> RunRecord:
    """A run as the pipeline reads it, whichever version logged it
    (:func:`~dpicl_audit.mechanisms.registry.upgraded_run`)."""
    stored = store.get_run(run_id)
    return upgraded_run(stored) or stored


def run_plan(run: RunRecord) -> AuditPlan:
    """The plan a run was started with (credentials masked)."""
    return AuditPlan.from_public(run.plan)


def run_design(run: RunRecord, plan: AuditPlan) -> Design:
    """The design a run recorded, read by its mechanism's module."""
    if run.design is None:
        raise InvalidAuditInput(f"run {run.id} has no design recorded")
    return get_mechanism(plan.mechanism.name).load_design(run.design)


def estimate_setting(s: SettingRows) -> SettingResult:
    """One epsilon setting's estimates from its logged rows (clean rows for bootstrap runs,
    trials otherwise), with its refusals and response times tested for dependence on the
    world (:func:`with_channels`). The mechanism estimates from the answered rows only: a
    refused trial released no answer. A mechanism registered from outside may return the
    setting's JSON mapping (:mod:`dpicl_audit.mechanisms.base`): it is read here, at that
    edge."""
    answered = [r for r in s.rows if not is_refusal(r)]
    if not answered and s.rows:
        n1 = sum(1 for r in s.rows if r.world == 1)
        out = SettingResult.of(
            **s.claims.to_json()
            | {
                "trials": len(s.rows),
                "n_with": n1,
                "n_without": len(s.rows) - n1,
                "black_box": Estimate.of(error="every trial was refused: no answer to read"),
                "white_box": None,
            }
        )
    else:
        out = _mechanism_estimate(replace(s, rows=answered))
    return out if s.bootstrap and not any(is_refusal(r) for r in s.rows) else with_channels(out, s)


def with_channels(out: SettingResult, s: SettingRows) -> SettingResult:
    """``out`` with the setting's refusals and times tested (:mod:`dpicl_audit.estimators.
    channels`) under ``refusals`` and ``timing``; a dependent one makes the setting's figures
    (black-box, else white-box; a figure-less setting gets a black-box one) a VIOLATION
    naming it."""
    alpha = channel_alpha(1 if s.claims.family is None else s.claims.family.settings)
    refusals = refusal_test(s.rows, alpha)
    timing = None if s.bootstrap else timing_test(s.rows, alpha)
    found = {k: v for k, v in (("refusals", refusals), ("timing", timing)) if v is not None}
    if not found:
        return out
    out = out.updated(**found)
    for section in found.values():
        if section["status"] != "violation":
            continue
        flagged = Verdict(Status.VIOLATION, str(section["message"]), violation=True)
        key = "black_box" if out.black_box is not None or out.white_box is None else "white_box"
        est = out.estimate(key) or Estimate.of(error=str(section["message"]))
        if est.verdict is not None and est.verdict.status is Status.VIOLATION:
            flagged = Verdict(
                Status.VIOLATION, f"{est.verdict.message}; {section['message']}", violation=True
            )
        out = out.updated(**{key: est.updated(verdict=flagged)})
    return out


def _mechanism_estimate(s: SettingRows) -> SettingResult:
    found: SettingResult | JsonMapping = get_mechanism(s.plan.mechanism.name).estimate(s)
    if isinstance(found, SettingResult):
        return found
    if isinstance(found, Mapping):
        return SettingResult.from_json(jsonable(found))
    raise InvalidAuditInput(
        f"mechanism {s.plan.mechanism.name!r}: estimate() returned {type(found).__name__}, "
        "expected a SettingResult (or its JSON mapping)"
    )


def estimate_run(store: TrialStore, run_id: str) -> RunResult:
    """Results of a run from its log: per-epsilon estimates next to theory and exact.

    Typed as the store will hold them (issue 28): the mechanisms' typed settings are
    gathered into a :class:`~dpicl_audit.results.RunResult`, given as the store will read it
    back (:meth:`~dpicl_audit.results.Record.stored`), so a run's results recomputed here
    and the ones read back from the log are one value."""
    old = upgraded_run(store.get_run(run_id))
    if old is not None and old.results is not None:
        return RunResult.from_json(old.results)  # an old audit's estimate, pipeline's shape
    run = load_run(store, run_id)
    plan = run_plan(run)
    design = run_design(run, plan)
    mech = get_mechanism(plan.mechanism.name)
    contexts = store.contexts(run_id)
    bootstrap = run.kind == "bootstrap"
    clean = store.trials(run_id, CLEAN_SETTING) if bootstrap else []
    threat_models = (
        ["black-box", "white-box"]
        if bootstrap or plan.threat_model == "white-box"
        else ["black-box"]
    )
    # The run's claims are stated for its tests together (estimators.family): the tests
    # each setting states claims from (one figure per threat model, for most designs).
    # One more member: the run's conformance tests together (estimators.conformance).
    family = Family(
        size=len(plan.mechanism.epsilons) * mech.claims_per_setting(design, threat_models) + 1,
        confidence=plan.confidence,
        settings=len(plan.mechanism.epsilons),
    )
    # The design's clean outputs are known exactly only on the rule-following simulator:
    # there the release distribution is predicted in closed form (estimators.conformance).
    server = json_object(run.versions.get("server"))
    simulator = bool(server.get("simulator")) or server.get("engine") == "oracle"
    settings = []
    for k, eps in enumerate(plan.mechanism.epsilons):
        claims = mech.setting_claims(plan, design, eps, contexts)
        claims = claims.with_family(family, simulator=simulator)
        rows = clean if bootstrap else store.trials(run_id, claims.setting)
        settings.append(estimate_setting(SettingRows(plan, design, k, rows, claims, bootstrap)))
    if bootstrap:
        # What a real-trial run of the same design needs before its verdicts have power
        # (trial_budget): the planning figure a bootstrap exists to give.
        needs = needs_from_bootstrap(
            [s.as_mapping() for s in settings], confidence=plan.confidence, split=plan.split
        )
        settings = [
            s.updated(real_trials_for_power=needs.get(float(s.get("epsilon_theory"))))
            for s in settings
        ]
    run = store.get_run(run_id)
    return RunResult.of(
        run_id=run_id,
        kind=run.kind,
        name=run.name,
        status=run.status,
        created_at=run.created_at.isoformat(),
        plan=run.plan,
        versions=run.versions,
        mechanism=plan.mechanism.name,
        design=mech.summary(design),
        confidence=plan.confidence,
        delta=plan.mechanism.delta,
        threat_models=threat_models,
        family=family.to_json(),
        settings=tuple(settings),
        queries=run.queries,
        llm_calls=run.llm_calls,
        wall_time_s=run.wall_time_s,
    ).stored()
