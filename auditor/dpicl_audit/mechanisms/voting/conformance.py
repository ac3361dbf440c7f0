"""Private voting's conformance tests of one setting (:mod:`dpicl_audit.estimators.conformance`).

* black-box: on the simulator (clean votes known: the design's), the positive answer's
  release rate in each world against the closed form ``claims.release_rates``; on any
  engine, the order of each world's released labels (model-free:
  :mod:`dpicl_audit.estimators.exchangeable`);
* white-box: the noise ``noisy - clean`` per label (clean from the ``internal`` debug
  endpoint, else the design's on the simulator); without either, determinism alone (a
  continuous noise never repeats a noisy histogram);
* bootstrap runs: the same noise tests on the collected debug rows; a noise check that says
  "smaller than claimed" is NONCONFORMING (noise scale) too.

:func:`voting_conformance` adds the setting's ``conformance`` and reads every verdict of the setting
with it (:func:`~dpicl_audit.mechanisms.trial_estimates.finish_conformance`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dpicl_audit.claims import SettingClaims
from dpicl_audit.estimators.conformance import (
    ConformanceTest,
    rate_tests,
    residual_tests,
)
from dpicl_audit.jsontypes import JsonMapping, json_float, json_int, json_object
from dpicl_audit.mechanisms.gaussian import GaussianFacts
from dpicl_audit.mechanisms.trial_estimates import finish_conformance, released_answers
from dpicl_audit.mechanisms.voting.design import AuditDesign, design_votes
from dpicl_audit.results import SettingResult
from dpicl_audit.store import TrialRecord

__all__ = ["voting_conformance"]


def _noise_check_test(check: JsonMapping | None) -> list[ConformanceTest]:
    """A noise check that found less noise than claimed, as a (decided) conformance test."""
    if not check or check.get("status") != "smaller":
        return []
    return [
        ConformanceTest(
            "noise scale",
            "noise_check",
            0.0,
            json_float(check.get("sigma_upper") or 0.0),
            json_int(check.get("n_residuals") or check.get("df") or 0),
            str(check.get("message")),
        )
    ]


def voting_conformance(
    design: AuditDesign,
    out: SettingResult,
    rows: Sequence[TrialRecord],
    claims: SettingClaims,
    *,
    temperature: float,
    bootstrap: bool = False,
    known_votes: bool = True,
    seed: Sequence[int] = (),
) -> SettingResult:
    """Voting's conformance tests of one setting (module docstring). ``known_votes``: the
    simulator's votes are the design's (the membership prompt of the audit template; a
    deployment's classification prompt is answered by the most similar demonstration)."""
    sigma = claims.sigma
    black: list[ConformanceTest] = []
    white: list[ConformanceTest] = []
    simulator = claims.simulator and float(temperature) == 0.0 and known_votes
    rates = claims.release_rates
    counts = None if out.black_box is None else out.black_box.counts
    if not bootstrap and simulator and design.attack == "inquery" and rates is not None and counts:
        tp, fn, fp, tn = counts
        black = rate_tests(tp, tp + fn, fp, fp + tn, rates)
    if bootstrap:
        white += _noise_check_test(out.noise_check)
    noisy = [r for r in rows if isinstance(r.observation.get("noisy_votes"), Mapping)]
    if noisy and sigma is not None:
        labels = list(design.labels)
        try:
            values = np.array(
                [
                    [json_float(json_object(r.observation["noisy_votes"])[lab]) for lab in labels]
                    for r in noisy
                ]
            )
        except (KeyError, TypeError, ValueError):
            values = None
        partitions = claims.own(GaussianFacts).partitions
        clean = _clean_votes(design, noisy, labels, simulator, partitions)
        if values is not None and clean is not None:
            white += residual_tests(
                values - clean,
                sigma,
                groups=[r.context_id for r in noisy],
                names=labels,
            )
        elif values is not None:
            white += _determinism(values)
    # The released labels' order (a real run's, not a bootstrap's clean rows): model-free.
    answers = None if bootstrap else released_answers(rows, "label")
    return finish_conformance(out, claims, black, white, answers=answers, seed=seed)


def _clean_votes(
    design: AuditDesign,
    rows: Sequence[TrialRecord],
    labels: list[str],
    simulator: bool,
    partitions: int,
) -> np.ndarray | None:
    """Each row's clean votes: logged (``internal``), else the design's on the simulator."""
    if all(isinstance(r.observation.get("clean_votes"), Mapping) for r in rows):
        return np.array([design.clean_vector(r.observation["clean_votes"]) for r in rows])
    if not simulator or design.attack != "inquery" or len(labels) != 2 or partitions < 1:
        return None
    with_v, without_v = design_votes(design, partitions)
    return np.array([with_v if r.world == 1 else without_v for r in rows], dtype=np.float64)


def _determinism(values: np.ndarray) -> list[ConformanceTest]:
    n = values.shape[0]
    distinct = int(np.unique(values, axis=0).shape[0])
    if distinct == n:
        return []
    return [
        ConformanceTest(
            "determinism",
            "repeated_answers",
            0.0,
            float(n - distinct),
            n,
            f"{n - distinct} of {n} noisy answers repeat an earlier one exactly (continuous "
            "noise never does)",
        )
    ]
