"""Audit plans: defaults, validation on construction, TOML files, flag overrides, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from dpicl_audit.errors import InvalidAuditInput, InvalidPlan
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.sources import MAX_PLAN_BYTES

PLAN_TOML = """
name = "nightly"
dataset = "news-mini"
canary = "mislabeled"
setting = "deployment"
threat_model = "white-box"
attack = "inquery"
trials = 500
confidence = 0.9
seed = 11

[target]
base_url = "http://example.test:9000/"
admin_token = "adm"
api_key = "usr"

[mechanism]
epsilons = [1, 2, 4, 8]
delta = 1e-6
partitions = 5
shots = 3
temperature = 0.5
calibration = "analytic"

[neighbour]
position = 4
partition_seed = 99

[deployment]
labels = ["World", "Sports", "Business", "Sci/Tech"]
positive = "Sports"
negative = "World"

[bootstrap]
n_llm = 50
n_sample = 1000
"""


def test_defaults_are_the_papers_setting() -> None:
    plan = AuditPlan()
    assert plan.mechanism.epsilons == (1.0, 2.0, 4.0, 8.0)
    assert plan.mechanism.delta == 1e-5
    assert plan.setting == "audit-template"
    assert plan.attack == "inquery"
    assert plan.neighbour.relation == "replace-one"
    assert plan.confidence == 0.95
    assert plan.bootstrap.n_sample == 400_000
    assert plan.mechanism.n_exemplars == plan.mechanism.partitions * plan.mechanism.shots


def test_plan_is_frozen() -> None:
    plan = AuditPlan()
    with pytest.raises(ValidationError):
        plan.trials = 3  # type: ignore[misc]


def test_toml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN_TOML)
    plan = AuditPlan.from_toml(path)
    assert plan.target.base_url == "http://example.test:9000"
    assert plan.target.admin_token is not None
    assert plan.target.admin_token.get_secret_value() == "adm"
    assert plan.mechanism.partitions == 5 and plan.mechanism.calibration == "analytic"
    assert plan.neighbour.position == 4 and plan.neighbour.partition_seed == 99
    assert plan.deployment.positive == "Sports"
    assert plan.bootstrap.n_llm == 50
    assert plan.setting_key(4.0) == "eps=4"
    assert plan.setting_key(0.5) == "eps=0.5"


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN_TOML)
    plan = AuditPlan.from_sources(
        path,
        {"trials": 100, "mechanism.epsilons": [2.0], "target.api_key": None, "seed": 5},
    )
    assert plan.trials == 100 and plan.seed == 5
    assert plan.mechanism.epsilons == (2.0,)
    assert plan.mechanism.partitions == 5  # from the file
    assert plan.target.api_key is not None  # None flags keep the file's value


def test_flags_only() -> None:
    plan = AuditPlan.from_sources(None, {"threat_model": "white-box", "mechanism.partitions": 3})
    assert plan.threat_model == "white-box" and plan.mechanism.partitions == 3


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"mechanism.epsilons": [1.0, -2.0]}, "mechanism.epsilons"),
        ({"mechanism.epsilons": [1.0, 1.0]}, "distinct"),
        ({"mechanism.epsilons": []}, "mechanism.epsilons"),
        ({"mechanism.delta": 1.5}, "delta"),
        ({"confidence": 1.0}, "confidence"),
        ({"trials": 3}, "trials"),
        ({"canary": "famous"}, "canary"),
        ({"threat_model": "grey-box"}, "threat_model"),
        ({"attack": "gap"}, "attack"),
        ({"target.base_url": "ftp://x"}, "base_url"),
        ({"dataset": "hf:"}, "dataset"),
        ({"neighbour.relation": "add-remove"}, "neighbour.relation"),
        ({"neighbour.position": 8}, "position"),
        ({"deployment.positive": "Yes", "deployment.negative": "Yes"}, "must differ"),
        ({"deployment.labels": ["A"]}, "deployment.labels"),
        ({"deployment.labels": ["A", "B"], "deployment.positive": "C"}, "positive label"),
        ({"deployment.template": "no slots"}, "{exemplars}"),
        ({"unknown_knob": 1}, "unknown setting"),
        # Each was an httpx or socket traceback at the first request.
        ({"target.base_url": "http://[::1"}, "is not a URL: Invalid port"),
        ({"target.base_url": "http://127.0.0.1:99999"}, "port 99999, outside 1 to 65535"),
        ({"target.base_url": "http://:8000"}, "names no host"),
    ],
)
def test_bad_values_are_named(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidPlan) as info:
        AuditPlan.from_sources(None, overrides)
    assert needle in str(info.value)
    assert isinstance(info.value, InvalidAuditInput) and isinstance(info.value, ValueError)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidPlan, match="does not exist"):
        AuditPlan.from_toml(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("trials = = 3")
    with pytest.raises(InvalidPlan, match="not valid TOML"):
        AuditPlan.from_toml(bad)


def test_tokens_never_leave_in_public_dump() -> None:
    plan = AuditPlan.from_sources(
        None, {"target.admin_token": "s3cret-admin", "target.api_key": "s3cret-user"}
    )
    dumped = plan.public_dump()
    assert "s3cret" not in repr(dumped)
    assert "s3cret" not in repr(plan)
    again = AuditPlan.from_public(dumped, admin_token="new-admin")
    assert again.target.admin_token is not None
    assert again.target.admin_token.get_secret_value() == "new-admin"
    assert again.target.api_key is None  # masked value is not a key
    assert again.model_dump(exclude={"target"}) == plan.model_dump(exclude={"target"})


def test_with_credentials() -> None:
    plan = AuditPlan().with_credentials(admin_token="a", api_key="k")
    assert plan.target.admin_token is not None and plan.target.api_key is not None
    assert plan.target.admin_token.get_secret_value() == "a"
    assert plan.target.api_key.get_secret_value() == "k"
    assert AuditPlan().with_credentials() == AuditPlan()


def test_auditor_never_imports_the_server() -> None:
    """The auditor is an independent implementation: importing all of it loads no dpicl."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, dpicl_audit\n"
        "for m in pkgutil.walk_packages(dpicl_audit.__path__, 'dpicl_audit.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n == 'dpicl' or n.startswith('dpicl.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_plan_files_that_are_not_plans(tmp_path: Path) -> None:
    # Each was a traceback (IsADirectoryError, UnicodeDecodeError) or, for /dev/zero, a
    # read that never ended (MemoryError).
    with pytest.raises(InvalidPlan, match="cannot be read: Is a directory"):
        AuditPlan.from_toml(tmp_path)
    binary = tmp_path / "plan.bin"
    binary.write_bytes(b"\x00\xff\xfe")
    with pytest.raises(InvalidPlan, match=r"not UTF-8 text \(byte b'\\xff' at position 1\)"):
        AuditPlan.from_toml(binary)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (MAX_PLAN_BYTES + 1))
    with pytest.raises(InvalidPlan, match="larger than"):
        AuditPlan.from_toml(huge)
    if Path("/dev/zero").exists():
        with pytest.raises(InvalidPlan, match="larger than"):
            AuditPlan.from_toml("/dev/zero")


def test_plan_errors_quote_the_value_but_never_a_token() -> None:
    # "trials: Input should be a valid integer" did not say what it got.
    with pytest.raises(InvalidPlan, match=r"trials: .* \(got 'many'\)"):
        AuditPlan.from_sources(None, {"trials": "many"})
    with pytest.raises(InvalidPlan) as info:
        AuditPlan.from_sources(None, {"target.admin_token": ["hunter2"]})
    assert "target.admin_token" in str(info.value) and "hunter2" not in str(info.value)
