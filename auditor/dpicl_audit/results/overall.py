"""The overall verdict of one or more runs, in one line with its exit status in words.

``run``, ``bootstrap``, ``resume`` and ``report`` open their summary with it, the HTML report
opens with it, and the exit status is the one it names (:func:`~dpicl_audit.results.run.
results_exit_code`, the same function): a reader who stops after one line knows what the
audit found and what a deployment gate does with it (issue 45). The line is at most 80
characters for up to 99 findings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.results.run import RunResult, results_exit_code
from dpicl_audit.verdicts import Status, worst_status

__all__ = ["Overall", "overall_verdict"]


@dataclass(frozen=True)
class Overall:
    """The worst status of the runs (None: no figure has a verdict), the exit status it
    gives, and the line that says both."""

    status: Status | None
    exit_code: int
    figures: int
    counts: Mapping[str, int]
    line: str

    @property
    def word(self) -> str:
        """The verdict's word as the line shows it (``consistent``, ``VIOLATION``, ...)."""
        return self.line.split(" · ")[0].removeprefix("verdict: ")

    def to_json(self) -> JsonObject:
        return {
            "status": None if self.status is None else self.status.value,
            "exit_code": self.exit_code,
            "figures": self.figures,
            "counts": dict(self.counts),
            "line": self.line,
        }


def overall_verdict(results: Sequence[RunResult | JsonMapping], *, strict: bool = False) -> Overall:
    """The runs' overall verdict: their worst status and the exit status ``run``/``report``
    give for it (``strict``: ``--strict``)."""
    runs = [r if isinstance(r, RunResult) else RunResult.from_json(r) for r in results]
    statuses = [st for r in runs for st in r.statuses()]
    counts = Counter(st.value for st in statuses)
    code = results_exit_code(runs, strict=strict)
    n = len(statuses)
    if not statuses:
        return Overall(None, code, 0, {}, f"verdict: none · exit {code} · no figure to judge")
    worst = worst_status(statuses)
    k = counts[worst.value]
    of = f"{k} of {n}"
    if worst is Status.VIOLATION:
        word, what = "VIOLATION", f"{of} break the privacy claim"
    elif worst is Status.BUG:
        word, what = "BUG", f"{of} above the mechanism's exact ε"
    elif worst is Status.NONCONFORMING:
        word, what = "NONCONFORMING", f"{of}: server breaks its contract"
    elif worst is Status.INCONCLUSIVE:
        if strict:
            word, what = "INCONCLUSIVE", f"{of} figures underpowered"
        else:
            word = "no violation seen"
            what = f"{of} underpowered (--strict: 3)"
    elif worst is Status.OK:
        word, what = "consistent", f"all {n} figures consistent, with power"
    else:
        word, what = worst.value, f"{of} figures could not be computed"
    gate = "fail" if code else "pass"
    return Overall(worst, code, n, dict(counts), f"verdict: {word} · exit {code} ({gate}) · {what}")
