"""The report's words: verdict sentences, a run's worst verdict, noise-check findings."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from dpicl_audit.report.data import ReportRow
from dpicl_audit.verdicts import worst_status

__all__ = ["VERDICT_WORDS", "eps_label", "fmt", "noise_findings", "run_verdict", "verdict_sentence"]


VERDICT_WORDS = {
    "violation": "VIOLATED",
    "bug": "BUG",
    "nonconforming": "NONCONFORMING",
    "inconclusive": "INCONCLUSIVE",
    "ok": "ok",
}


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def eps_label(setting: str) -> str:
    return setting.replace("eps=", "ε=")


def verdict_sentence(row: ReportRow) -> str:
    """The plain-words verdict of one row."""
    where = (
        f"{row.engine}, {row.mechanism} {row.attack} ({row.design}), {row.method}, "
        f"{row.threat}, at epsilon {fmt(row.epsilon_theory, 3)}"
    )
    conf = f"{row.confidence:.0%}"
    classical = f"; the assumption-free classical bound is {fmt(row.epsilon_classic)}"
    if row.status == "violation":
        text = (
            f"PRIVACY CLAIM VIOLATED ({where}): the mechanism is not mu-GDP for any mu < "
            f"{fmt(row.mu_lower)} ({conf} confidence), which under the Gaussian trade-off the "
            f"server claims means epsilon >= {fmt(row.epsilon_emp)}, above the claimed "
            f"{fmt(row.epsilon_theory, 3)}{classical}."
        )
        exact = row.epsilon_exact
        if exact is not None and row.epsilon_emp is not None and row.epsilon_emp > exact:
            text += (
                f" It is also above the exact epsilon {fmt(exact)} of the mechanism the "
                "server reports, so the server does not run the mechanism it claims."
            )
        return text
    if row.status == "bug":
        # A claim at confidence c is wrong in at most 1 - c of runs of a correct server: per
        # run when the run's figures hold together (estimators.family), else per figure.
        if row.family_size:
            chance = (
                f"or this run is one of the at most {1 - row.confidence:.0%} of runs of a "
                f"correct server in which one of its {row.family_size} tests overshoots "
                "(the run's claims hold together at this confidence)"
            )
        else:
            chance = (
                f"or this is one of the at most {1 - row.confidence:.0%} of audits of a "
                "correct server whose bound overshoots"
            )
        return (
            f"BUG ({where}): a figure ({conf} confidence: GDP epsilon {fmt(row.epsilon_emp)}"
            f"{classical}) exceeds the mechanism's exact epsilon {fmt(row.epsilon_exact)}, "
            f"though not the claimed {fmt(row.epsilon_theory, 3)}: the server or the auditor "
            f"has a bug, {chance} (run it again with more trials to tell)."
        )
    if row.status == "nonconforming":  # the verdict's message starts with the word itself
        return f"NONCONFORMING ({where}): {row.message.removeprefix('NONCONFORMING')}"
    if row.status == "inconclusive":  # the verdict's message starts with the word itself
        return f"INCONCLUSIVE ({where}): {row.message.removeprefix('INCONCLUSIVE: ')}"
    if row.status == "error":
        return f"no estimate ({where}): {row.message}"
    return (
        f"consistent ({where}): the audit could have seen a violation and found none: GDP "
        f"epsilon_emp {fmt(row.epsilon_emp)}{classical}, epsilon_exact "
        f"{fmt(row.epsilon_exact)}, epsilon_theory {fmt(row.epsilon_theory, 3)}."
    )


def run_verdict(rows: Sequence[ReportRow], probes: Iterable[str] = ()) -> str:
    """The worst status of a run's rows and of the statuses its audits from outside add
    (``probes``: :attr:`~dpicl_audit.report.data.RunData.probe_statuses`), as the run's exit
    code reads them: violation > bug > nonconforming > inconclusive > ok."""
    return worst_status([*(r.status for r in rows), *probes])


def noise_findings(rows: Sequence[ReportRow]) -> list[str]:
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows:
        nc = r.noise_check
        if not nc or (r.run_id, r.setting) in seen:
            continue
        seen.add((r.run_id, r.setting))
        if nc.get("status") in ("smaller", "larger"):
            out.append(f"{r.engine}, {r.method}, {eps_label(r.setting)}: {nc.get('message')}")
    return out
