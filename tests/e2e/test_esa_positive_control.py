"""Positive controls for ESA flagged by black-box audits alone (issue 14).

Two broken servers (``tests/e2e/broken_esa_server.py``: the real app, unchanged API, one bug
in the mechanism, reporting the configured sigma and epsilon), served by uvicorn with the
white-box debug endpoint OFF, so the auditor sees only the released texts:

* ``sum``: the partition embeddings are summed instead of averaged, noise calibrated for
  the mean: the canary's shift is D instead of D / T;
* ``noise``: the noise is 4x smaller than the configured sigma.

Each is audited with the balanced (pivotal canary) ESA design, black-box, T = 3 partitions,
8 zero-shot candidates (the oracle's fair coin between y1 and y0), epsilon 8, 300 trials.
The release rates (mechanisms.esa.build) are 0.956 / 0.044 (sum) and 0.986 / 0.014
(noise), against 0.718 / 0.282 for an honest server. Over 4,000 simulated repetitions of the
counts, mu_lower had mean 2.71 (sd 0.20) and 3.39 (sd 0.22) against the claimed mu 1.67 of
epsilon 8: every repetition was a VIOLATION (the claim sits 5.2 and 8 standard deviations
below the mean; false-failure rate under 1e-6). The oracle engine stands in for the model
because the point here is the auditor; the embedder is the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.pipeline.run import run_audit
from tests.servers import oracle_server_env, target_plan

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["sum", "noise"])
@pytest.mark.long
def test_black_box_esa_audit_flags_a_broken_server(
    mode: str, start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(
        oracle_server_env(tmp_path, "off"), fault=f"tests.e2e.broken_esa_server:{mode.upper()}"
    )
    plan = target_plan(
        srv.url,
        **{
            "mechanism.name": "esa",
            "mechanism.partitions": 3,
            "mechanism.epsilons": [8.0],
            "trials": 300,
            "seed": 5,
        },
    )
    results = asyncio.run(
        run_audit(plan, db=tmp_path / "audit.db", out_dir=tmp_path, progress=False)
    )
    (s,) = results["settings"]
    bb = s["black_box"]
    print(f"{mode}: mu_lower {bb['mu_lower']:.3f} emp {bb['epsilon_lower']:.3f} "
          f"tpr {bb['tpr']:.3f} fpr {bb['fpr']:.3f} {bb['verdict']['message']}")  # fmt: skip
    assert s["design"] == "pivotal" and s["white_box"] is None
    assert results["versions"]["server"]["whitebox"] == "off"
    assert bb["verdict"]["status"] == "violation", bb["verdict"]
    assert bb["epsilon_lower"] > s["epsilon_theory"]
