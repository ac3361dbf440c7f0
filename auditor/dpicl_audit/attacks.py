"""The attack registry: which attack applies to which mechanism under which threat model.

An attack is the auditor's choice of audit query and decision rule (paper 000, Section 3 and
Appendix B). Its *mechanics* live in the mechanism package it applies to
(:mod:`dpicl_audit.mechanisms`), which builds the query and turns an observation into a
decision or a score; this table is what the plan validates against, what ``--help`` lists and
what the report names. To add an attack: add an :class:`AttackSpec` here, then handle its name
in the ``build_design`` (and, if it decides differently, ``decide``/``score``) of each
mechanism listed in ``mechanisms``. Issue 10's RDP query sequences (paper 003) are planned as
attacks of ``voting``. A mechanism registered from outside (an entry point of
``dpicl_audit.mechanisms``) names the attacks it takes in its audit's ``attacks``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpicl_audit.mechanisms.names import BUILTIN, load_external

__all__ = ["ATTACKS", "AttackSpec", "attacks_for", "check_attack"]

ThreatModels = tuple[str, ...]
BOTH: ThreatModels = ("black-box", "white-box")


@dataclass(frozen=True, slots=True)
class AttackSpec:
    """One attack: where it applies and where it comes from."""

    name: str
    mechanisms: tuple[str, ...]
    threat_models: ThreatModels
    source: str
    summary: str


ATTACKS: dict[str, AttackSpec] = {
    a.name: a
    for a in (
        AttackSpec(
            "inquery",
            ("voting", "esa", "dps-mozo"),
            BOTH,
            "paper 000, Prompts 1-3",
            "ask whether the canary is present; the answer names one of two options",
        ),
        AttackSpec(
            "brainwash",
            ("voting",),
            BOTH,
            "paper 000, Appendix B (baseline)",
            "inject a wrong label with the canary; present = the canary's own label wins",
        ),
        AttackSpec(
            "repeat",
            ("esa",),
            ("black-box",),
            "paper 000, Prompt 5 (baseline)",
            "ask to complete the canary's first half; present = its second half appears",
        ),
        AttackSpec(
            "reference-vector",
            ("esa",),
            ("white-box",),
            "paper 000, Prompt 6 (baseline)",
            "a fixed false-statement canary scored against two reference texts",
        ),
    )
}
# Paper 003's adversaries (Section 4.1, Appendix D.2): RDP audits of query sequences.
ATTACKS |= {
    name: AttackSpec(name, ("voting",), BOTH, "paper 003, Section 4.1 / Appendix D.2", summary)
    for name, summary in (
        ("nat-advq", "natural canary; the canary's text asked --queries times"),
        ("pois-advq", "mislabelled canary (poison); its text asked --queries times"),
        ("pois-natq-confident", "poisoned copy of the most agreed natural query; N natural"),
        ("pois-natq-unconfident", "poisoned copy of the least agreed natural query; N natural"),
        ("pois-natq-all-same", "poison instructs one fixed answer; N natural queries"),
        ("pois-natq-mapping", "poison gives a wrong label mapping; N natural queries"),
    )
}


def attacks_for(mechanism: str) -> tuple[str, ...]:
    """The attacks that apply to ``mechanism`` (a registered one's: its audit's ``attacks``)."""
    if mechanism not in BUILTIN:
        audit = load_external(mechanism)
        declared = getattr(audit, "attacks", None)
        if declared is not None:
            return tuple(declared)
    return tuple(a.name for a in ATTACKS.values() if mechanism in a.mechanisms)


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
