"""Paper 003's RDP audit of one setting (:class:`RdpAudit`): its curves per order, their
epsilons and its verdict (:mod:`dpicl_audit.mechanisms.voting.rdp_estimates`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpicl_audit.results.record import COUNT, NUMBER, VERDICT, Codec, Record
from dpicl_audit.verdicts import Verdict

__all__ = ["RdpAudit"]


@dataclass(frozen=True)
class RdpAudit(Record):
    """The ``rdp`` block of a setting: how many queries the sequence asks, the confidence of
    its composed bounds and its verdict. The curves (``orders``, ``theory``, ``exact``, the
    2-cut and k-cut bounds, real and simulated), ``per_query`` and ``epsilons`` (Theorem 1
    of paper 003) are in ``extra``."""

    queries: int | None = None
    confidence: float | None = None
    verdict: Verdict | None = None

    CODECS: ClassVar[dict[str, Codec]] = {
        "queries": COUNT,
        "confidence": NUMBER,
        "verdict": VERDICT,
    }
