"""What a mechanism supplies the probes: :class:`Ingredients`.

A probe from outside needs a few things of the mechanism under audit, and nothing else: a
context body of the run's design, a way to make one hold a number of answers, the audit
query, how many answers one budget holds, how the setting's claim is read from a context's
record. Each mechanism's audit returns them once per run
(:meth:`~dpicl_audit.mechanisms.base.MechanismAudit.ingredients`); each probe of
:mod:`.registry` names those it needs (:attr:`~.registry.Probe.needs`) and is left out
where one is missing. A mechanism gains a probe by supplying its ingredients, never by a
method of its own per probe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dpicl_audit.claims import SettingClaims
from dpicl_audit.client import ContextBody
from dpicl_audit.context_info import ContextInfo

__all__ = ["Body", "Claim", "Hold", "Ingredients", "PerToken", "TailContexts"]

#: ``(world, epsilon, name)``: the ``POST /v1/contexts`` body of C1 (world 1) or C0 of the
#: run's design at ``epsilon``, named ``name``.
Body = Callable[[int, float, str], ContextBody]
#: ``(body, epsilon, answers)``: ``body`` made to hold ``answers`` answers at ``epsilon``, as
#: the mechanism's answers are limited (a budget composed as they compose, or a count of
#: queries); None where no budget within the server's limit holds them.
Hold = Callable[[ContextBody, float, int], ContextBody | None]
#: ``(epsilon, info)``: the setting's claims the claim check reads
#: (:func:`dpicl_audit.verdicts.claims.calibration_departure`), from a created context's
#: record.
Claim = Callable[[float, ContextInfo], SettingClaims]
#: The per-token bound of a generation mechanism from its contexts' records (None where
#: they report none).
PerToken = Callable[[Sequence[ContextInfo]], float | None]


@dataclass(frozen=True, slots=True)
class TailContexts:
    """What the tail probe asks (:mod:`.tails`): contexts of T partitions of one exemplar,
    none holding the queried text, whose release is a noisy argmax over two labels."""

    #: ``(epsilon, partitions, answers)``: (body, query) of such a context holding
    #: ``answers`` answers; None where no budget within the server's limit holds them.
    make: Callable[[float, int, int], tuple[ContextBody, str] | None]
    #: its two labels
    labels: tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ingredients:
    """What one run's mechanism and design supply its probes. A probe runs where every
    ingredient it needs is there (not None, not False)."""

    #: the server context's task (``classification`` or ``generation``)
    task: str
    #: the stem of the probes' context names (``dpicl-audit <seed>``)
    name: str
    #: the plan's epsilons (the first is where the probes ask)
    epsilons: tuple[float, ...]
    #: the largest budget epsilon the server takes, as the run read it
    limit: float
    body: Body
    hold: Hold
    #: the design's one audit query; None where there is none a probe may ask (a sequence
    #: of queries, or an attack whose query the probes do not ask)
    query: str | None = None
    #: whether the query asks whether the canary is there (the ``inquery`` attack), so that
    #: its answers are the trials' release (the ledger's and the parameters' probes)
    membership: bool = False
    #: whether each answer is a Gaussian release, mu-GDP at its reported sensitivity / sigma,
    #: so that a budget's spend is their GDP composition (the ledger's sequential probe
    #: predicts it so)
    gaussian: bool = False
    #: answers one budget within :attr:`limit` holds at an epsilon; None where a context's
    #: answers are counted in its body (DPS-MOZO's ``queries``), not composed in a budget
    capacity: Callable[[float], int] | None = None
    #: tokens a generation answer is asked for (None: a classification answer)
    answer_tokens: int | None = None
    #: the claim check's facts from a context's record (the calibration scan)
    claim: Claim | None = None
    #: a generation context's ``max_tokens``, which its calibration composes (probed above)
    token_limit: int | None = None
    #: the per-token bound the surface's pair is probed against, position by position; a
    #: text: why the mechanism's claim has none (said in the results)
    per_token: PerToken | str | None = None
    #: makes the tail probe's contexts (called only when it runs: it may load a dataset)
    tail_contexts: Callable[[], TailContexts] | None = None

    def supplies(self, needs: Sequence[str]) -> bool:
        """Whether every ingredient named in ``needs`` is there."""
        return all(getattr(self, need) not in (None, False) for need in needs)

    def held(self, world: int, epsilon: float, answers: int, name: str) -> ContextBody | None:
        """A fresh context of ``world`` at ``epsilon`` holding ``answers`` answers."""
        return self.hold(self.body(world, epsilon, f"{self.name} {name}"), epsilon, answers)
