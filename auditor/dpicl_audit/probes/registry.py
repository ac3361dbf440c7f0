"""The one list of probes from outside: :data:`PROBES`.

Each :class:`Probe` names the ingredients it needs of the run's mechanism
(:class:`~.ingredients.Ingredients`), the statuses of its own that decide the run's exit code
(its others, ``ok`` and ``unchecked``, add none), and whether only a run of real black-box
queries makes it. The plan's ``probes`` (``--probes``) take their names from here
(:data:`ALL_PROBES`), the runner makes them in this order
(:mod:`dpicl_audit.pipeline.runner`), and the results read their sections and statuses back
through it (:meth:`dpicl_audit.results.RunResult.probes`). A new probe is one module of this
package with a ``probe(target, ingredients)`` function, and one entry here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

from dpicl_audit.client import AuditTarget
from dpicl_audit.probes import calibration, ledger, limits, parameters, surface, switches, tails
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.verdicts.model import Status

__all__ = ["ALL_PROBES", "PROBES", "Probe", "ProbeName"]

#: Makes one probe for a run: its results section, or None where it does not apply.
Run = Callable[[AuditTarget, Ingredients], Awaitable[Mapping[str, object] | None]]


@dataclass(frozen=True, slots=True)
class Probe:
    """One audit from outside (module docstring)."""

    name: str
    #: what it checks, in a few words
    summary: str
    run: Run
    #: the ingredients it needs (:class:`~.ingredients.Ingredients` fields)
    needs: tuple[str, ...]
    #: its statuses that decide the run's exit code
    deciding: Mapping[str, Status]
    #: made only by a run of real black-box queries
    black_box_only: bool = False


_PROBES = (
    Probe(
        "ledger",
        "the server's ledger: answers per budget, reported costs, bursts",
        ledger.probe,
        ("query",),
        # its reported costs departing: NONCONFORMING; a reported noise that admits fewer
        # answers than the claim: BUG
        {"nonconforming": Status.NONCONFORMING, "bug": Status.BUG},
    ),
    Probe(
        "calibration",
        "the reported sigma against the claim at epsilons the plan does not audit",
        calibration.probe,
        ("claim",),
        {"bug": Status.BUG},
    ),
    Probe(
        "parameters",
        "the client's sampling parameters varied on every route",
        parameters.probe,
        ("query", "membership"),
        {"nonconforming": Status.NONCONFORMING},
    ),
    Probe(
        "surface",
        "every route's whole response, max_tokens against the context's limit",
        surface.probe,
        ("query",),
        {
            "nonconforming": Status.NONCONFORMING,
            "violation": Status.VIOLATION,
            "bug": Status.BUG,
        },
        black_box_only=True,
    ),
    Probe(
        "switches",
        "undocumented debug switches (query parameters, headers) on every answering route",
        switches.probe,
        ("query",),
        {"violation": Status.VIOLATION},
    ),
    Probe(
        "limits",
        "inputs at each documented limit: refusals, messages and charges alike in both worlds",
        limits.probe,
        ("query",),
        {"violation": Status.VIOLATION},
        black_box_only=True,
    ),
    Probe(
        "tails",
        "whether the noise has the tails it claims, black-box",
        tails.probe,
        ("tail_contexts", "capacity"),
        {"nonconforming": Status.NONCONFORMING},
        black_box_only=True,
    ),
)
#: Every probe by name, in the order a run makes them.
PROBES: dict[str, Probe] = {p.name: p for p in _PROBES}
#: Their names: the plan's ``probes`` and ``--probes`` take these.
ALL_PROBES: tuple[str, ...] = tuple(PROBES)

# The plan's name for one of them, derived from the list (the type checker sees its base).
if TYPE_CHECKING:
    ProbeName: TypeAlias = str
else:
    ProbeName = Literal[ALL_PROBES]
