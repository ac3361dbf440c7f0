"""Issue 44, item 6: the client-parameter sweep's power where a leak is plain to see, and its
error on a server whose parameters do not reach the release, by simulation of the sweep's
labels (``probes.parameters._judge``, the test the sweep runs on the labels it got).

The leak of the issue: the four temperature-0 variants a server answers through
``--api openai`` (chat, completions, both streamed; the native route refuses the parameter)
answer the majority label 30 times in 30, every other variant at the honest share of the
pivotal C1 at the sweep's epsilon (0.52; 13-20 of 30). Before issue 44 each variant was
tested alone against the others (Bonferroni over 11) and the leak read p = 3e-4 against
1e-4 about half the time; pooling the variants that send one parameter value catches it in
every simulated sweep. The requirement is at least 99 in 100: 300 of 300 sweeps caught
shows a rate above 0.990 (one-sided Clopper-Pearson at 95%: 0.05^(1/300)); the long test's
2,000 of 2,000, above 0.9985.

The honest side: the sweep's test is a Bonferroni union of exact tests at 1e-4, so its error
is at most 1e-4 per run (measured over 100,000 simulated honest sweeps: 5e-5). Here at most
one false alarm is allowed in 300 honest sweeps (2,000 in the long test: at most 3); a
correct test fails that with probability below 5e-4 (Poisson tails at rate 1e-4). The
generators are seeded, so each run of these tests draws the same sweeps.

Every sweep also holds the schema's other parameters (issue 44, item 4) that dpicl answers
(those it ignores: the penalties, ``user``, ``metadata``, ...; :data:`ANSWERED`) at
``SCREEN`` answers each first and ``PER_SCHEMA`` more where those are one label (about one
in 16), as a run against dpicl reads them: those add tests to the Bonferroni correction and
answers to the pools. A client ``seed`` that seeds the noise (each seed value one label on
every route, so that it always passes the screen) is caught in at least 295 of 300 sweeps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dpicl_audit.probes.parameters as parameters
from dpicl.api.openai.protocol import IGNORED
from dpicl_audit.probes.parameters import PER_SCHEMA, SCREEN, VARIANTS, _judge, schema_variants
from dpicl_audit.probes.sections import ParameterVariant

SHARE = 0.52
N = 30
_OPENAPI = json.loads((Path(__file__).parents[2] / "openapi" / "openapi.json").read_text())
#: The schema's variants dpicl answers (it ignores them), through --api openai.
ANSWERED = [
    v
    for v in schema_variants(("chat", "completions"), _OPENAPI)
    if set(v[2]) <= {*IGNORED, "max_tokens", "max_completion_tokens"}
]


def _sweep(
    rng: np.random.Generator, leak: bool, seeded: bool = False, schema: bool = True
) -> list[ParameterVariant]:
    out: list[ParameterVariant] = []
    for name, route, extra in VARIANTS:
        if route == "native":  # through --api openai: no native route
            continue
        hits = N if leak and extra.get("temperature") == 0 else int(rng.binomial(N, SHARE))
        out.append({"variant": name, "refused": False, "labels": {"Yes": hits, "No": N - hits}})
    for name, route, extra in ANSWERED if schema else ():
        # screened first (parameters.SCREEN answers): tested only where they are one label
        seen = int(rng.binomial(SCREEN, SHARE))
        said: ParameterVariant = {
            "variant": name,
            "refused": False,
            "screening": {"Yes": seen, "No": SCREEN - seen},
            "route": route,
            "sent": extra,
        }
        if seen in (0, SCREEN):
            hits = int(rng.binomial(PER_SCHEMA, SHARE))
            said["labels"] = {"Yes": hits, "No": PER_SCHEMA - hits}
        out.append(said)
    if seeded:  # one label per seed value, the same on chat and completions
        for seed in (7, 8):
            hits = PER_SCHEMA * int(rng.random() < SHARE)
            for route in ("chat", "completions"):
                labels = {"Yes": hits, "No": PER_SCHEMA - hits}
                out.append(
                    {
                        "variant": f"{route}, seed {seed}",
                        "refused": False,
                        "labels": labels,
                        "route": route,
                        "sent": {"seed": seed},
                    }
                )
    return out


def _caught(
    rng: np.random.Generator, sweeps: int, *, named: bool = True, schema: bool = True
) -> int:
    """How many of ``sweeps`` leaking sweeps are flagged (``named``: each naming temperature
    0, the parameter that leaks)."""
    flagged = 0
    for _ in range(sweeps):
        got = _judge(_sweep(rng, leak=True, schema=schema))
        flagged += got["status"] == "nonconforming"
        assert not named or got["status"] == "ok" or "temperature 0" in str(got["variant"])
    return flagged


def _false_alarms(rng: np.random.Generator, sweeps: int) -> int:
    return sum(_judge(_sweep(rng, leak=False))["status"] != "ok" for _ in range(sweeps))


def test_the_vectorised_fisher_test_is_scipys() -> None:
    from scipy import stats

    from dpicl_audit.probes.parameters import fisher_two_sided

    for hits, asked, successes, total in [(30, 30, 200, 400), (7, 15, 200, 400), (0, 30, 5, 60)]:
        table = [[hits, asked - hits], [successes - hits, total - asked - successes + hits]]
        want = stats.fisher_exact(table).pvalue
        assert fisher_two_sided(hits, asked, successes, total) == pytest.approx(want, rel=1e-9)


def test_leak_of_four_temperature_zero_variants_is_caught_every_time() -> None:
    assert _caught(np.random.default_rng(44), 300) == 300


def test_one_route_leak_is_named_and_honest_sweeps_are_not_flagged() -> None:
    rng = np.random.default_rng(45)
    assert _false_alarms(rng, 300) <= 1
    # A leak on the completions route only (its two temperature-0 variants at 30/30) is
    # still found and named (pooled temperature 0, the route, or the variant itself).
    caught = 0
    for _ in range(100):
        sweep = _sweep(rng, leak=False)
        for v in sweep:
            if v["variant"].startswith("completions") and "temperature 0" in v["variant"]:
                v["labels"] = {"Yes": N, "No": 0}
        caught += _judge(sweep)["status"] == "nonconforming"
    assert caught >= 95, caught


def test_pre_issue_44_per_variant_test_missed_the_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test can fail: the old per-variant test alone (pools removed) on the old sweep
    (no schema variants) misses the leak in a sizeable share of sweeps, which is what item 6
    reported."""
    monkeypatch.setattr(
        parameters,
        "_groups",
        lambda answered: [(str(v["variant"]), [i]) for i, v in enumerate(answered)],
    )
    missed = 200 - _caught(np.random.default_rng(46), 200, named=False, schema=False)
    assert missed > 20, missed


def test_a_seed_that_fixes_the_noise_is_caught_and_named() -> None:
    rng = np.random.default_rng(49)
    assert len(ANSWERED) >= 15  # the schema's parameters dpicl ignores are in every sweep
    caught = 0
    for _ in range(300):
        got = _judge(_sweep(rng, leak=False, seeded=True))
        caught += got["status"] == "nonconforming"
        assert got["status"] == "ok" or "seed" in str(got["variant"]), got["variant"]
    assert caught >= 295, caught


@pytest.mark.long
def test_sweep_power_and_error_over_2000_sweeps() -> None:
    assert _caught(np.random.default_rng(47), 2000) == 2000
    assert _false_alarms(np.random.default_rng(48), 2000) <= 3
