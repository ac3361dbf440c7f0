"""The typed results as the mechanisms build them (issue 28, item 2): :meth:`Record.of` and
:meth:`Record.updated` keep a producer's keys (a typed field given as None is written as
null), :meth:`Record.stored` is what the store reads back, and a mechanism registered from
outside may still return its setting as a JSON mapping, read at that edge."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.pipeline import estimation
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.verdicts import Status, Verdict


def test_a_producers_record_writes_the_keys_it_was_given() -> None:
    est = Estimate.of(tp=3, fn=1, fp=0, tn=4, epsilon_lower=math.inf, threshold=0.5)
    est = est.updated(verdict=Verdict(status=Status.OK, message="fine"), roc=[[0.0, 1.0]])
    setting = SettingResult.of(setting="eps=1", trials=8, black_box=est, white_box=None)
    got = setting.to_json()
    assert got["white_box"] is None and "rdp" not in got  # given as None: null; absent: absent
    bb = got["black_box"]
    assert bb["epsilon_lower"] == "inf" and bb["threshold"] == 0.5 and bb["roc"] == [[0.0, 1.0]]
    assert est.verdict is not None and bb["verdict"] == est.verdict.to_dict()
    assert Verdict.from_dict(bb["verdict"]) == est.verdict and bb["verdict"]["status"] == "ok"
    assert est.counts == (3, 1, 0, 4) and Estimate.of(error="x").counts is None
    assert est.get("threshold") == 0.5 and est.get("tp") == 3 and est.get("absent", 7) == 7
    assert est.as_mapping()["verdict"] == est.verdict  # the claims read Python values
    # What the store reads back is the same value, its JSON the same JSON.
    again = setting.stored()
    assert again == SettingResult.from_json(got) and again.to_json() == got


def _rows(name: str) -> SettingRows:
    plan: Any = SimpleNamespace(mechanism=SimpleNamespace(name=name))
    return SettingRows(plan, None, 0, [], SettingClaims("eps=1", 1.0, 1e-5), False)


@pytest.mark.parametrize("returned", ["typed", "mapping"])
def test_a_plug_in_may_return_its_setting_as_json(
    monkeypatch: pytest.MonkeyPatch, returned: str
) -> None:
    want = SettingResult.of(setting="eps=1", black_box=Estimate.of(error="no trials"), k=1)
    found = want if returned == "typed" else want.to_json()
    mech = SimpleNamespace(estimate=lambda s: found)
    monkeypatch.setattr(estimation, "get_mechanism", lambda name: mech)
    got = estimation.estimate_setting(_rows("plug-in"))
    assert isinstance(got, SettingResult) and got.to_json() == want.to_json()
    assert got.black_box is not None and got.black_box.error == "no trials"


def test_a_plug_in_returning_something_else_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    mech = SimpleNamespace(estimate=lambda s: [1, 2])
    monkeypatch.setattr(estimation, "get_mechanism", lambda name: mech)
    with pytest.raises(InvalidAuditInput, match=r"'plug-in'.*returned list"):
        estimation.estimate_setting(_rows("plug-in"))
