"""Sentence embeddings for ESA: sentence-transformers in-process, CPU or CUDA.

Rows are normalised to unit L2 norm here, in float64, whatever the model's own pipeline
does: ESA's sensitivity bound (2/T) rests on ``||v|| <= 1``. A row the model returns as
exactly zero stays zero (norm 0 <= 1 keeps the bound); a non-finite row is an engine error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dpicl.engines.base import FloatArray
from dpicl.engines.models import resolve_embedder
from dpicl.errors import EngineError

log = logging.getLogger("dpicl.engines")

__all__ = ["SentenceTransformerEmbedder", "normalise_rows"]


def normalise_rows(x: npt.ArrayLike) -> FloatArray:
    """Rows of ``x`` scaled to unit L2 norm (float64); zero rows stay zero."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise EngineError(f"the embedder returned an array of shape {arr.shape}, not 2-D")
    if not np.isfinite(arr).all():
        raise EngineError("the embedder returned non-finite values")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    out: FloatArray = np.divide(arr, norms, out=np.zeros_like(arr), where=norms > 0)
    return out


class SentenceTransformerEmbedder:
    """An :class:`~dpicl.engines.base.Embedder` over a sentence-transformers model."""

    def __init__(self, model: Any, *, name: str, batch_size: int = 64) -> None:
        self._model: Any = model
        self.name: str = name
        dim_fn = getattr(model, "get_embedding_dimension", None)
        if dim_fn is None:  # sentence-transformers < 5
            dim_fn = model.get_sentence_embedding_dimension
        dim = dim_fn()
        if not dim:
            raise EngineError(f"the embedder {name!r} does not report its dimension")
        self.dim: int = int(dim)
        self.batch_size = batch_size
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls, name: str | None = None, *, device: str = "cpu", batch_size: int = 64
    ) -> SentenceTransformerEmbedder:
        """Load ``name`` (``None``: the bundled all-MiniLM-L6-v2). Blocking."""
        src = resolve_embedder(name)  # first: a missing directory fails before the import
        from sentence_transformers import SentenceTransformer

        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise EngineError(f"device {device!r} was asked for but CUDA is not available")
        try:
            model = SentenceTransformer(src, device=device)
        except (OSError, ValueError) as exc:
            # The path and the loader's message go to the operator's log, not to clients.
            log.error("cannot load the embedder from %s: %s", src, exc)
            raise EngineError(
                "the configured embedder (DPICL_EMBEDDER) cannot be loaded; see the server log"
            ) from None
        model.eval()
        label = name if name is not None else "all-MiniLM-L6-v2 (bundled)"
        return cls(model, name=label, batch_size=batch_size)

    def embed_sync(self, texts: Sequence[str]) -> FloatArray:
        """The blocking part of :meth:`embed`."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float64)
        with self._lock:
            raw = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=False,
                show_progress_bar=False,
            )
        out = normalise_rows(raw)
        if out.shape != (len(texts), self.dim):
            raise EngineError(
                f"the embedder returned shape {out.shape}, expected ({len(texts)}, {self.dim})"
            )
        return out

    async def embed(self, texts: Sequence[str]) -> FloatArray:
        return await asyncio.to_thread(self.embed_sync, list(texts))
