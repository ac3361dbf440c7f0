"""Rendering a context's template into the prompts the engine sees.

Slots are replaced with ``str.replace``, never ``str.format``: exemplars and queries are
user text and may contain braces.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpicl.engines.base import Exemplar, PromptSpec

SLOTS = ("{exemplars}", "{query}", "{labels}")


def format_exemplars(exemplars: Sequence[Exemplar], task: str) -> str:
    tag = "Label" if task == "classification" else "Output"
    return "\n\n".join(f"Input: {e.input}\n{tag}: {e.output}" for e in exemplars)


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
    head = template.replace("{labels}", label_text).replace(
        "{exemplars}", format_exemplars(exemplars, task)
    )
    text = head.replace("{query}", query)
    # head[:query_at] holds no query slot, so it is exactly text[:query_at] for every query.
    query_at = head.find("{query}")
    instructions = template.replace("{labels}", label_text)
    for slot in ("{exemplars}", "{query}"):
        instructions = instructions.replace(slot, "")
    return PromptSpec(
        text=text,
        query=query,
        exemplars=tuple(exemplars),
        instructions=instructions,
        prefix_chars=max(query_at, 0),
        cache_scope=cache_scope,
    )
