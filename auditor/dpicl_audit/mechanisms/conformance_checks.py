"""The conformance tests of one setting, per mechanism (:mod:`dpicl_audit.estimators.conformance`).

* voting, black-box: on the simulator (clean votes known: the design's), the positive answer's
  release rate in each world against the closed form ``meta["release_rates"]``;
* voting, white-box: the noise ``noisy - clean`` per label (clean from the ``internal`` debug
  endpoint, else the design's on the simulator); without either, determinism alone (a
  continuous noise never repeats a noisy histogram);
* ESA, white-box: the noise of the mean embedding ``noisy - clean`` per dimension and along
  fixed directions (the signal direction, the all-ones one, seeded random ones);
* bootstrap runs: the same noise tests on the collected debug rows; a noise check that says
  "smaller than claimed" is NONCONFORMING (noise scale) too.

Each function adds ``out["conformance"]`` and reads every verdict of the setting with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpicl_audit.estimators.conformance import (
    Conformance,
    ConformanceTest,
    apply_conformance,
    conformance_alpha,
    rate_tests,
    residual_tests,
)
from dpicl_audit.store import TrialRecord

if TYPE_CHECKING:
    from dpicl_audit.mechanisms.voting_designs import AuditDesign

__all__ = ["esa_conformance", "finish_conformance", "voting_conformance"]

#: Seeded random directions for ESA's joint scale test (plus the signal and all-ones ones).
_N_RANDOM_DIRECTIONS = 8


def finish_conformance(
    out: dict[str, Any],
    meta: Mapping[str, Any],
    black: list[ConformanceTest],
    white: list[ConformanceTest],
) -> dict[str, Any]:
    """Store the setting's conformance (the release's tests, the noise's, and both) and read
    every verdict of the setting with all of them."""
    alpha = conformance_alpha(meta, len(black) + len(white))
    bb = Conformance(alpha, tuple(black)).to_dict()
    both = Conformance(alpha, tuple(black + white)).to_dict()
    out["conformance"] = {
        "status": both["status"],
        "alpha": alpha,
        "differs": both["differs"],
        "message": both["message"],
        "black_box": bb,
        "white_box": Conformance(alpha, tuple(white)).to_dict(),
    }
    # A departure anywhere means the server does not run the mechanism it reports: every
    # figure of the setting reads it (a VIOLATION or BUG stays, naming it too).
    for key, conf in (("black_box", both), ("white_box", both)):
        est = out.get(key)
        if isinstance(est, dict) and isinstance(est.get("verdict"), dict):
            est["verdict"] = apply_conformance(est["verdict"], conf)
    return out


def _noise_check_test(check: Mapping[str, Any] | None) -> list[ConformanceTest]:
    """A noise check that found less noise than claimed, as a (decided) conformance test."""
    if not check or check.get("status") != "smaller":
        return []
    return [
        ConformanceTest(
            "noise scale",
            "noise_check",
            0.0,
            float(check.get("sigma_upper") or 0.0),
            int(check.get("n_residuals") or check.get("df") or 0),
            str(check.get("message")),
        )
    ]


def voting_conformance(
    design: AuditDesign,
    out: dict[str, Any],
    rows: Sequence[TrialRecord],
    meta: Mapping[str, Any],
    *,
    temperature: float,
    bootstrap: bool = False,
    known_votes: bool = True,
) -> dict[str, Any]:
    """Voting's conformance tests of one setting (module docstring). ``known_votes``: the
    simulator's votes are the design's (the membership prompt of the audit template; a
    deployment's classification prompt is answered by the most similar demonstration)."""
    sigma = meta.get("sigma")
    black: list[ConformanceTest] = []
    white: list[ConformanceTest] = []
    simulator = bool(meta.get("simulator")) and float(temperature) == 0.0 and known_votes
    rates = meta.get("release_rates")
    bb = out.get("black_box") or {}
    if (
        not bootstrap
        and simulator
        and design.attack == "inquery"
        and rates is not None
        and all(isinstance(bb.get(k), int) for k in ("tp", "fn", "fp", "tn"))
    ):
        black = rate_tests(bb["tp"], bb["tp"] + bb["fn"], bb["fp"], bb["fp"] + bb["tn"], rates)
    if bootstrap:
        white += _noise_check_test(out.get("noise_check"))
    noisy = [r for r in rows if isinstance(r.observation.get("noisy_votes"), Mapping)]
    if noisy and sigma is not None:
        labels = list(design.labels)
        try:
            values = np.array(
                [[float(r.observation["noisy_votes"][lab]) for lab in labels] for r in noisy]
            )
        except (KeyError, TypeError, ValueError):
            values = None
        clean = _clean_votes(design, noisy, labels, simulator, int(meta.get("partitions") or 0))
        if values is not None and clean is not None:
            white += residual_tests(
                values - clean,
                float(sigma),
                groups=[r.context_id for r in noisy],
                names=labels,
            )
        elif values is not None:
            white += _determinism(values)
    return finish_conformance(out, meta, black, white)


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
    from dpicl_audit.mechanisms.voting_designs import design_votes

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


def esa_conformance(
    out: dict[str, Any],
    rows: Sequence[TrialRecord],
    meta: Mapping[str, Any],
    *,
    signal: tuple[np.ndarray, np.ndarray] | None,
    seed: int,
    bootstrap: bool = False,
) -> dict[str, Any]:
    """ESA's conformance tests of one setting (module docstring)."""
    sigma = meta.get("sigma")
    white: list[ConformanceTest] = []
    if bootstrap:
        check = out.get("noise_check") or {}
        if check.get("status") == "smaller":
            white += [
                ConformanceTest(
                    "noise scale",
                    "noise_check",
                    0.0,
                    float((check.get("sigma_interval") or [0.0, 0.0])[1]),
                    int(check.get("df") or 0),
                    str(check.get("message")),
                )
            ]
    res = [
        r
        for r in rows
        if isinstance(r.observation.get("residual"), list) and r.observation.get("residual")
    ]
    if res and sigma is not None:
        mat = np.array([r.observation["residual"] for r in res], dtype=np.float64)
        d = mat.shape[1]
        rng = np.random.default_rng([seed, 27])
        dirs = [np.ones(d), *rng.standard_normal((_N_RANDOM_DIRECTIONS, d))]
        if signal is not None and float(np.linalg.norm(signal[0] - signal[1])) > 0:
            dirs.insert(0, signal[0] - signal[1])
        white += residual_tests(
            mat, float(sigma), groups=[r.context_id for r in res], directions=np.array(dirs)
        )
    return finish_conformance(out, meta, [], white)
