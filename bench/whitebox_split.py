"""The white-box threshold's selection share (the plan's ``split``), chosen by measured power
(issue 35, item 9).

A white-box voting audit logs, per trial, the score ``noisy[positive] - noisy[negative]``.
With the symmetric (pivotal) design the canary moves the clean margin from -1 to +1, so the
score is ``N(+1, 2 sigma^2)`` with the canary and ``N(-1, 2 sigma^2)`` without, and the black-box
decision (the positive label released) is ``score > 0``. ``--design paper`` simulates paper
000's [1, T-1] against [0, T] at T = 4 instead (margins -2 and -4: the black-box rule sits far
in the tail, so the white-box figure rests on the held-out threshold). sigma is the server's
calibration (``dpicl.privacy.calibration.sigma_for``, classic, sensitivity sqrt 2) at the
claimed epsilon.
The trials are split between the worlds as a default run splits them (1,000 per epsilon, 500
each), and each simulated run goes through the auditor's own :func:`~dpicl_audit.estimators.
whitebox.audit_figures` at the default confidence (0.95), exactly as a run calls it.

For each ``split`` it reports, over ``--reps`` simulated runs:

* on an honest server: the mean GDP figure ``mu_lower / mu_exact`` and the mean classical
  bound ``epsilon_lower / epsilon_exact`` (how much of the truth the audit certifies);
* against a server whose noise is weaker than it claims (sigma divided by ``--leak``): the
  detection rate, the share of runs whose white-box figures give VIOLATION (``mu_lower`` above
  the claimed mu, or the classical bound above the claimed epsilon);
* and the same detection rate at the other ``--trials`` counts.

    nice -n 10 .venv/bin/python bench/whitebox_split.py [--reps 200] [--epsilons 1,4]

The numbers are recorded in docs/auditing.md ("White-box never weaker than black-box").
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dpicl.privacy.calibration import epsilon_exact, sigma_for
from dpicl_audit.estimators.whitebox import audit_figures

SENSITIVITY = math.sqrt(2.0)
DELTA = 1e-5


#: The clean margin noisy[positive] - noisy[negative] is centred at these (with, without the
#: canary): pivotal (the canary's partition decides, T odd: [m+1, m] against [m, m+1]) and
#: paper 000's [1, T-1] against [0, T] at T = 4, where the black-box rule is far in the tail.
DESIGNS = {"pivotal": (1.0, -1.0), "paper": (-2.0, -4.0)}


def one_run(
    sigma: float, trials: int, split: float, seed: int, design: str = "pivotal"
) -> tuple[float | None, float | None]:
    """(mu_lower, epsilon_classical) of one simulated white-box run."""
    rng = np.random.default_rng(seed)
    half = trials // 2
    sd = math.sqrt(2.0) * sigma
    m1, m0 = DESIGNS[design]
    pos = rng.normal(m1, sd, half)
    neg = rng.normal(m0, sd, trials - half)
    figs = audit_figures(
        pos,
        neg,
        rng=np.random.default_rng([seed, 1]),
        delta=DELTA,
        confidence=0.95,
        black_box_pos=pos > 0,
        black_box_neg=neg > 0,
        fraction=split,
    )
    return figs.mu_lower, figs.epsilon_classical


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--splits", default="0.2,0.3,0.4,0.5,0.6")
    ap.add_argument("--leak", type=float, default=1.5, help="sigma divided by this (a fault)")
    ap.add_argument("--trials", default="1000,2000,4000")
    ap.add_argument("--design", default="pivotal", choices=sorted(DESIGNS))
    args = ap.parse_args()
    splits = [float(s) for s in args.splits.split(",")]
    trial_counts = [int(t) for t in args.trials.split(",")]
    t0 = time.perf_counter()
    print(f"design {args.design}")
    print(
        "epsilon | split | honest mu_lower/mu_exact | honest eps_classic/eps_exact | "
        + " | ".join(f"detect x{args.leak:g} @{n}" for n in trial_counts)
    )
    for eps in [float(e) for e in args.epsilons.split(",")]:
        sigma = sigma_for(eps, DELTA, SENSITIVITY)
        mu_claim = SENSITIVITY / sigma
        eps_exact = epsilon_exact(sigma, SENSITIVITY, DELTA)
        for split in splits:
            mus, cls = [], []
            for r in range(args.reps):
                mu, ec = one_run(sigma, trial_counts[0], split, r, args.design)
                mus.append((mu or 0.0) / mu_claim)
                cls.append((ec or 0.0) / eps_exact)
            detect = []
            for n in trial_counts:
                hits = 0
                for r in range(args.reps):
                    mu, ec = one_run(sigma / args.leak, n, split, 10_000 + r, args.design)
                    hits += int((mu or 0.0) > mu_claim or (ec or 0.0) > eps)
                detect.append(hits / args.reps)
            print(
                f"{eps:g} | {split:.1f} | {np.mean(mus):.3f} | {np.mean(cls):.3f} | "
                + " | ".join(f"{d:.3f}" for d in detect),
                flush=True,
            )
    print(f"{args.reps} runs per cell; took {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
