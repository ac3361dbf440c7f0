"""Rendering a context's template into the prompts the engine sees.

Slots are filled in one pass over the template, never by ``str.format`` nor by one
``str.replace`` after another: exemplars, labels and queries are user text and may contain
braces, even a slot's name. Replacing slot after slot would fill ``{query}`` inside an
exemplar (the query would appear among the demonstrations) and expand ``{exemplars}`` inside
a label, once per label: a few kilobytes of request grew to gigabytes of prompt.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dpicl.engines.base import Exemplar, PromptSpec

SLOTS = ("{exemplars}", "{query}", "{labels}")
_SLOT = re.compile(r"\{(exemplars|query|labels)\}")


def format_exemplars(exemplars: Sequence[Exemplar], task: str) -> str:
    tag = "Label" if task == "classification" else "Output"
    return "\n\n".join(f"Input: {e.input}\n{tag}: {e.output}" for e in exemplars)


def _fill(template: str, values: Mapping[str, str]) -> tuple[str, int]:
    """``template`` with every slot replaced by its value, and where the first ``{query}``
    slot's value starts in the result (0 without one)."""
    # re.split with one group alternates literal text and slot names.
    pieces = _SLOT.split(template)
    out: list[str] = []
    size = 0
    query_at = -1
    for i, piece in enumerate(pieces):
        if i % 2:
            if piece == "query" and query_at < 0:
                query_at = size
            piece = values[piece]
        out.append(piece)
        size += len(piece)
    return "".join(out), max(query_at, 0)


@dataclass(frozen=True, slots=True)
class PromptPlan:
    """A prompt rendered up to its query: everything :func:`render` computes that does not
    depend on the query, so the prompts of many queries on the same exemplars (every query
    of a context) cost one string join each.

    ``segments`` is the filled template cut at its ``{query}`` slots: the prompt of a query
    ``q`` is ``q.join(segments)``, the very text that filling the template with ``q`` gives
    (the slots are filled in one pass, so a query is never itself searched for slots)."""

    segments: tuple[str, ...]
    exemplars: tuple[Exemplar, ...]
    instructions: str

    @property
    def prefix_chars(self) -> int:
        # Where the first query slot's value starts; 0 without a query slot (as _fill).
        return len(self.segments[0]) if len(self.segments) > 1 else 0

    @property
    def chars(self) -> int:
        """The characters this plan holds (for a cache's bound)."""
        return sum(map(len, self.segments)) + len(self.instructions)

    def prompt(
        self,
        query: str,
        *,
        cache_scope: str = "",
        cache_key: str | None = None,
        fallback: PromptSpec | None = None,
    ) -> PromptSpec:
        """The prompt of ``query``."""
        return PromptSpec(
            text=query.join(self.segments),
            query=query,
            exemplars=self.exemplars,
            instructions=self.instructions,
            prefix_chars=self.prefix_chars,
            cache_key=cache_key,
            cache_scope=cache_scope,
            fallback=fallback,
        )


def plan(
    template: str, exemplars: Sequence[Exemplar], *, task: str, labels: Sequence[str] = ()
) -> PromptPlan:
    """The query-independent part of :func:`render` (see :class:`PromptPlan`)."""
    label_text = ", ".join(labels)
    values = {"labels": label_text, "exemplars": format_exemplars(exemplars, task)}
    # As _fill, but each {query} slot closes a segment instead of taking a value.
    segments: list[str] = []
    current: list[str] = []
    for i, piece in enumerate(_SLOT.split(template)):
        if i % 2 and piece == "query":
            segments.append("".join(current))
            current = []
            continue
        current.append(values[piece] if i % 2 else piece)
    segments.append("".join(current))
    instructions, _ = _fill(template, {"labels": label_text, "exemplars": "", "query": ""})
    return PromptPlan(
        segments=tuple(segments), exemplars=tuple(exemplars), instructions=instructions
    )


def render(
    template: str,
    exemplars: Sequence[Exemplar],
    query: str,
    *,
    task: str,
    labels: Sequence[str] = (),
    cache_scope: str = "",
) -> PromptSpec:
    """Render one prompt; ``instructions`` is the template with its slots removed.

    ``prefix_chars`` marks the text before the first query slot: it is the same for every
    query on the same exemplars, so an engine may reuse its KV state (``PromptSpec``).
    """
    return plan(template, exemplars, task=task, labels=labels).prompt(
        query, cache_scope=cache_scope
    )
