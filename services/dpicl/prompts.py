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
    label_text = ", ".join(labels)
    text, query_at = _fill(
        template,
        {"labels": label_text, "exemplars": format_exemplars(exemplars, task), "query": query},
    )
    instructions, _ = _fill(template, {"labels": label_text, "exemplars": "", "query": ""})
    return PromptSpec(
        text=text,
        query=query,
        exemplars=tuple(exemplars),
        instructions=instructions,
        prefix_chars=query_at,
        cache_scope=cache_scope,
    )
