"""A setting's claims are typed (issue 48, item 2): :class:`~dpicl_audit.claims.SettingClaims`
with each mechanism's own facts, written among the setting's results in the JSON every
version wrote, and read back from it at that edge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.claims import Family, SettingClaims, StoredFacts, number
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.mechanisms.dps_mozo.facts import MozoFacts
from dpicl_audit.mechanisms.esa.facts import EsaFacts
from dpicl_audit.mechanisms.gaussian import GaussianFacts
from dpicl_audit.mechanisms.registry import get_mechanism

GOLDEN = Path(__file__).parent / "fixtures" / "golden_runs"
STORED = sorted(GOLDEN.glob("*/show.json"))


def _settings() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path in STORED:
        shown = json.loads(path.read_text(encoding="utf-8"))
        for s in shown["settings"]:
            out.append((path.parent.name, shown["mechanism"], s))
    return out


@pytest.mark.parametrize(("run", "mechanism", "stored"), _settings())
def test_stored_claims_read_and_write_back_as_stored(
    run: str, mechanism: str, stored: dict[str, Any]
) -> None:
    """Every golden run's setting (voting, ESA, DPS-MOZO, a bootstrap): its claims read by
    the mechanism's audit and written again are the stored keys and values, exactly; and
    its facts are the mechanism's own type."""
    claims = get_mechanism(mechanism).claims_from_json(stored)
    written = claims.to_json()
    assert written == {k: stored[k] for k in written}, run
    kind = {"voting": GaussianFacts, "esa": EsaFacts, "dps-mozo": MozoFacts}[mechanism]
    assert type(claims.facts) is kind
    # The claims' own keys the setting stored are all written back.
    known = {*SettingClaims.STORED, *claims.facts.to_json()}
    assert {k for k in stored if k in known} == set(written), run
    assert claims.family is not None and claims.family.size == stored["family"]["size"]


def test_unknown_keys_are_written_null_only_where_stated() -> None:
    bare = SettingClaims("eps=1", 1.0, 1e-5)
    assert set(bare.to_json()) == {
        "setting", "epsilon_theory", "delta", "context_ids", "sigma", "epsilon_exact"
    }  # fmt: skip
    stated = SettingClaims("eps=1", 1.0, 1e-5, nulls=frozenset({"epsilon_exact_server"}))
    assert stated.to_json()["epsilon_exact_server"] is None
    again = SettingClaims.from_json(stated.to_json())
    assert again == stated and again.facts == StoredFacts()
    fam = SettingClaims("eps=1", 1.0, 1e-5, family=Family(9, 0.9, 4), simulator=True)
    assert fam.to_json()["family"] == {"size": 9, "confidence": 0.9, "settings": 4}
    assert SettingClaims.from_json(fam.to_json()) == fam


def test_a_mechanisms_facts_are_read_as_its_own_type_or_refused() -> None:
    facts = GaussianFacts(8, "classical", "pivotal")
    claims = SettingClaims("eps=2", 2.0, 1e-5, facts=facts)
    assert claims.own(GaussianFacts) is facts
    with pytest.raises(InvalidAuditInput, match="GaussianFacts, expected MozoFacts"):
        claims.own(MozoFacts)


def test_context_ids_of_both_shapes() -> None:
    one = SettingClaims("e", 1.0, 1e-5, context_ids={"C1": "a", "C0": None})
    many = SettingClaims("e", 1.0, 1e-5, context_ids={"C1": ["a", "b"], "C0": ["c"]})
    assert one.context_id_set() == {"a"} and many.context_id_set() == {"a", "b", "c"}


def test_bad_stored_values_are_named() -> None:
    with pytest.raises(InvalidAuditInput, match="epsilon_theory"):
        SettingClaims.from_json({"sigma": 1.0})
    with pytest.raises(InvalidAuditInput, match="'abc'"):
        SettingClaims.from_json({"epsilon_theory": 1.0, "sigma": "abc"})
    assert number("inf") == float("inf") and number(3) == 3 and isinstance(number(3), int)
    with pytest.raises(InvalidAuditInput, match="True"):
        number(True)
