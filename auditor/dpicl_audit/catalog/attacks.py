"""The attacks: each one's threat models and source, and which mechanisms take it.

An attack is the auditor's choice of audit query and decision rule (paper 000, Section 3 and
Appendix B). Its *mechanics* live in the mechanism packages that take it
(:mod:`dpicl_audit.mechanisms`), which build the query and turn an observation into a
decision or a score; each mechanism's settings model lists the attacks it takes
(``MechanismSettings.attacks``). This table is what the plan validates against, what
``--help`` lists and what the report names. To add an attack: add an :class:`AttackSpec`
here, then name it in the ``attacks`` of each mechanism that handles it. The plan's
:data:`Attack` (and :data:`RdpAttack`) are this table's names, not a second list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

from dpicl_audit.catalog.mechanisms import mechanism_names, settings_for

__all__ = [
    "ATTACKS",
    "Attack",
    "AttackSpec",
    "RdpAttack",
    "attacks_for",
    "check_attack",
    "mechanisms_taking",
]

ThreatModels = tuple[str, ...]
BOTH: ThreatModels = ("black-box", "white-box")


@dataclass(frozen=True, slots=True)
class AttackSpec:
    """One attack: the threat models it applies under and where it comes from."""

    name: str
    threat_models: ThreatModels
    source: str
    summary: str
    #: paper 003's adversaries: an RDP audit of a query sequence, not of one query
    sequence: bool = False


ATTACKS: dict[str, AttackSpec] = {
    a.name: a
    for a in (
        AttackSpec(
            "inquery",
            BOTH,
            "paper 000, Prompts 1-3",
            "ask whether the canary is present; the answer names one of two options",
        ),
        AttackSpec(
            "brainwash",
            BOTH,
            "paper 000, Appendix B (baseline)",
            "inject a wrong label with the canary; present = the canary's own label wins",
        ),
        AttackSpec(
            "repeat",
            ("black-box",),
            "paper 000, Prompt 5 (baseline)",
            "ask to complete the canary's first half; present = its second half appears",
        ),
        AttackSpec(
            "reference-vector",
            ("white-box",),
            "paper 000, Prompt 6 (baseline)",
            "a fixed false-statement canary scored against two reference texts",
        ),
    )
}
# Paper 003's adversaries (Section 4.1, Appendix D.2): RDP audits of query sequences.
ATTACKS |= {
    name: AttackSpec(name, BOTH, "paper 003, Section 4.1 / Appendix D.2", summary, True)
    for name, summary in (
        ("nat-advq", "natural canary; the canary's text asked --queries times"),
        ("pois-advq", "mislabelled canary (poison); its text asked --queries times"),
        ("pois-natq-confident", "poisoned copy of the most agreed natural query; N natural"),
        ("pois-natq-unconfident", "poisoned copy of the least agreed natural query; N natural"),
        ("pois-natq-all-same", "poison instructs one fixed answer; N natural queries"),
        ("pois-natq-mapping", "poison gives a wrong label mapping; N natural queries"),
    )
}

# The plan's names for them, derived from the table (the type checker sees their base).
if TYPE_CHECKING:
    Attack: TypeAlias = str
    RdpAttack: TypeAlias = str
else:
    Attack = Literal[tuple(ATTACKS)]
    RdpAttack = Literal[tuple(a.name for a in ATTACKS.values() if a.sequence)]


def attacks_for(mechanism: str) -> tuple[str, ...]:
    """The attacks that ``mechanism`` takes (its settings model's ``attacks``)."""
    model = settings_for(mechanism)
    return () if model is None else tuple(model.attacks)


def mechanisms_taking(attack: str) -> tuple[str, ...]:
    """The mechanisms that take ``attack``."""
    return tuple(m for m in mechanism_names() if attack in attacks_for(m))


def check_attack(attack: str, mechanism: str, threat_model: str) -> None:
    """Raise ``ValueError`` (a plan validation error) when the combination does not exist."""
    spec = ATTACKS.get(attack)
    if spec is None:
        raise ValueError(f"unknown attack {attack!r}; known: {sorted(ATTACKS)}")
    if attack not in attacks_for(mechanism):
        raise ValueError(
            f"attack {attack!r} does not apply to {mechanism}; {mechanism} takes "
            f"{attacks_for(mechanism)}"
        )
    if threat_model not in spec.threat_models:
        raise ValueError(f"attack {attack!r} is a {' / '.join(spec.threat_models)} attack")
