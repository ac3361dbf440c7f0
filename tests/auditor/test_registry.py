"""The mechanism registry finds mechanisms other packages register through entry points
(group ``dpicl_audit.mechanisms``: a settings model, whose ``audit`` names the audit), the
plan admits their names and settings, and broken registrations are refused with errors that
name them. Each case installs a fake distribution (a package and a
``*.dist-info`` with ``entry_points.txt``) in a temporary directory and imports the auditor in
a fresh interpreter with that directory on ``sys.path``, since the registry reads the entry
points once, on import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.catalog.mechanisms import BUILTIN, mechanism_names
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.plan import AuditPlan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "laplace_voting"

FAKE_SETTINGS = """
from typing import ClassVar, Literal

from dpicl_audit.catalog.settings import GaussianSettings

class FakeSettings(GaussianSettings):
    audit: ClassVar[str] = "fake_audit:FAKE"
    attacks: ClassVar[tuple[str, ...]] = ("inquery",)
    name: Literal["fake-voting"] = "fake-voting"

class NoAudit(FakeSettings):
    audit: ClassVar[str] = "fake_audit:NOT_AN_AUDIT"

NOT_SETTINGS = object()
"""

FAKE_AUDIT = """
from dpicl_audit.mechanisms.voting.audit import VotingAudit
from fake_mech import FakeSettings

class FakeVoting(VotingAudit):
    name = "fake-voting"
    settings = FakeSettings

FAKE = FakeVoting()
NOT_AN_AUDIT = object()
"""


def _fake(site: Path) -> None:
    (site / "fake_mech.py").write_text(FAKE_SETTINGS)
    (site / "fake_audit.py").write_text(FAKE_AUDIT)


def _install(site: Path, dist: str, entry_points: dict[str, str]) -> None:
    """A distribution ``dist`` whose entry points of the group are ``entry_points``."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[dpicl_audit.mechanisms]\n{lines}")


def _run(paths: list[Path], code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


def _json(out: subprocess.CompletedProcess[str]) -> Any:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = """
    import json
    from dpicl_audit.errors import InvalidPlan
    from dpicl_audit.mechanisms.registry import MECHANISMS, get_mechanism
    from dpicl_audit.plan import AuditPlan

    name = {name!r}
    plan = AuditPlan.from_mapping({{"mechanism": {{"name": name}}, "attack": {attack!r}}})
    try:
        AuditPlan.from_mapping({{"mechanism": {{"name": name}}, "attack": "repeat"}})
        refused = None
    except InvalidPlan as exc:
        refused = str(exc)
    audit = get_mechanism(name)
    print(json.dumps({{
        "known": sorted(MECHANISMS),
        "class": type(audit).__name__,
        "plan": plan.mechanism.name,
        "refused": refused,
    }}))
"""


def test_a_registered_audit_is_found_and_planned(tmp_path: Path) -> None:
    _fake(tmp_path)
    _install(tmp_path, "fake_mech", {"fake-voting": "fake_mech:FakeSettings"})
    got = _json(_run([tmp_path], PROBE.format(name="fake-voting", attack="inquery")))
    assert got["known"] == sorted([*BUILTIN, "fake-voting"])
    assert got["class"] == "FakeVoting" and got["plan"] == "fake-voting"
    # The attacks it takes are its audit's: ``repeat`` (an ESA attack) is refused, by name.
    assert "'repeat' does not apply to fake-voting" in got["refused"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"fake-voting": "fake_mech:NOT_SETTINGS"}, "not a MechanismSettings subclass"),
        ({"fake-voting": "fake_mech:NoAudit"}, "not a MechanismAudit instance"),
        ({"other-name": "fake_mech:FakeSettings"}, "loads the settings of 'fake-voting'"),
        ({"voting": "fake_mech:FakeSettings"}, "already audited"),
    ],
)
def test_a_broken_registration_is_refused_by_name(
    tmp_path: Path, entry: dict[str, str], message: str
) -> None:
    _fake(tmp_path)
    _install(tmp_path, "fake_mech", entry)
    out = _run([tmp_path], "import dpicl_audit.mechanisms.registry")
    assert out.returncode != 0
    name = next(iter(entry))
    assert message in out.stderr and repr(name) in out.stderr, out.stderr


def test_an_unknown_mechanism_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(InvalidPlan) as err:
        AuditPlan.from_mapping({"mechanism": {"name": "nope"}})
    assert "'nope'" in str(err.value)
    assert all(repr(n) in str(err.value) for n in mechanism_names())


def test_the_laplace_voting_example_registers_from_outside(tmp_path: Path) -> None:
    """``examples/laplace_voting`` adds one folder and one entry point: the plan takes its
    name and its own settings, the registry loads its audit, and its exact epsilon is the
    Laplace mechanism's."""
    entry = {"laplace-voting": "laplace_voting.audit_settings:LaplaceVotingSettings"}
    _install(tmp_path, "laplace_voting", entry)
    got = _json(_run([tmp_path, EXAMPLE], PROBE.format(name="laplace-voting", attack="brainwash")))
    assert "laplace-voting" in got["known"] and got["class"] == "LaplaceVotingAudit"
    code = """
        import json
        from laplace_voting.audit import laplace_epsilon_exact, laplace_scale
        print(json.dumps([
            [eps, laplace_scale(eps), laplace_epsilon_exact(laplace_scale(eps), 1e-5)]
            for eps in (0.5, 1.0, 4.0)
        ]))
    """
    for eps, scale, exact in _json(_run([tmp_path, EXAMPLE], code)):
        assert scale == pytest.approx(2.0 / eps)
        # Pure eps-DP, and tight: the two changed counts' loss reaches 2 / b = eps, so at a
        # small delta the exact epsilon is just below the claim.
        assert eps * 0.99 < exact <= eps + 1e-9
    code = """
        import json
        from dpicl_audit.plan import AuditPlan
        from laplace_voting.audit import LAPLACE_VOTING as L
        plan = AuditPlan.from_mapping({"mechanism": {"name": "laplace-voting"}, "trials": 50})
        print(json.dumps([
            L.planned_answers(plan, 2.0, 1),
            L.context_budget(plan, 2.0, 1),
            type(plan.mechanism).__name__,
            sorted(plan.mechanism.model_dump()),
            plan.mechanism.scale(2.0),
        ]))
    """
    answers, budget, model, fields, scale = _json(_run([tmp_path, EXAMPLE], code))
    # Its own settings: T partitions, no Gaussian calibration; the scale is 2 / epsilon.
    assert model == "LaplaceVotingSettings" and "calibration" not in fields
    assert "partitions" in fields and scale == 1.0
    # Budgeted by basic composition, which no pure-DP ledger exceeds.
    assert budget["epsilon"] >= 2.0 * answers
