"""The bundled SmolLM2 for the real-model test modules, on the device they are run for.

``DPICL_TEST_DEVICE`` (default ``cpu``) moves these modules' engines onto another device, so
that the same assertions run on a GPU: ``DPICL_TEST_DEVICE=cuda pytest -m slow
tests/server/test_transformers_engine.py tests/server/test_prefix_reuse.py``. Tests of what
only the CPU engine does (its attention and projection replacements) skip elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dpicl.engines.models import DEFAULT_CACHE_DIR, resolve_llm
from dpicl.engines.transformers.engine import TransformersEngine

__all__ = ["CACHE_DIR", "TEST_DEVICE", "cpu_only", "load_bundled"]

CACHE_DIR = Path(os.environ.get("DPICL_CACHE_DIR", str(DEFAULT_CACHE_DIR)))
TEST_DEVICE = os.environ.get("DPICL_TEST_DEVICE", "cpu")

cpu_only = pytest.mark.skipif(
    torch.device(TEST_DEVICE).type != "cpu",
    reason=f"what only the CPU engine does (DPICL_TEST_DEVICE={TEST_DEVICE})",
)


def load_bundled(device: str = TEST_DEVICE) -> TransformersEngine:
    """The bundled model (converted once into ``CACHE_DIR``) on ``device``, in float32 on
    every device (``DPICL_DTYPE=auto`` would take bfloat16 on a GPU): the assertions
    compare it with float32 references."""
    return TransformersEngine.load(resolve_llm(None, CACHE_DIR), device=device, dtype="float32")
