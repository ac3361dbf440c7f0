"""bench/gpu.py on CPU with a tiny Llama shape: the benchmark runs end to end, counts T = 10
calls per voting query, and reports against paper 000's anchor. (Its GPU figures come from a
CUDA machine; this machine has none.)"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module
    # As when run as a script: bench/ first on sys.path while it imports (gpu.py imports
    # served.py beside it), and not after (test_no_bench_module_shadows_an_installed_one).
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def test_gpu_bench_tiny_on_cpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bench = load_bench()
    assert pytest.approx(8e6 / (700 * 3600), rel=0.02) == bench.ANCHOR
    out_file = tmp_path / "rows.jsonl"
    rows = bench.main(
        [
            "--device=cpu",
            "--engines=transformers,transformers-nocache",
            "--models=8b",
            "--tiny",
            "--concurrency=1,4",
            "--queries=4",
            "--reps=2",
            f"--out={out_file}",
        ]
    )
    assert [(r.engine, r.model, r.concurrency, r.queries, len(r.seconds)) for r in rows] == [
        ("transformers", "tiny-llama", 1, 4, 2),
        ("transformers", "tiny-llama", 4, 4, 2),
        ("transformers-nocache", "tiny-llama", 1, 4, 2),
        ("transformers-nocache", "tiny-llama", 4, 4, 2),
    ]
    for r in rows:
        assert all(s > 0 for s in r.seconds)
        assert r.calls_per_s == pytest.approx(4 * 10 / statistics.median(r.seconds))
        lo, hi = r.calls_range
        assert lo <= r.calls_per_s <= hi
    # Every row reached the file as it was measured.
    written = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(w["engine"], w["concurrency"]) for w in written] == [
        (r.engine, r.concurrency) for r in rows
    ]
    out = capsys.readouterr().out
    assert "paper 000's average 3.2 calls/s" in out and "/3.2" in out
    assert "4 in flight / 1 in flight" in out
    assert "prefix cache on / off" in out


def test_served_prompts_are_keyed_for_the_prefix_cache() -> None:
    """The bench's prompts carry the server's cache key: one per partition of the context,
    the same for every query (before, only ``cache_scope`` was set and nothing was cached)."""
    bench = load_bench()
    a, b = bench.query_prompts(0, "ctx_b"), bench.query_prompts(1, "ctx_b")
    assert [p.cache_key for p in a] == [f"ctx_b/{t}" for t in range(bench.T)]
    assert [p.cache_key for p in a] == [p.cache_key for p in b]
    assert a[0].text != b[0].text


def test_no_bench_module_shadows_an_installed_one() -> None:
    """``python bench/X.py`` puts bench/ first on sys.path: a bench module named like an
    installed package (bench/requests.py did) breaks every import of it, vllm's included."""
    names = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
    bench = ROOT / "bench"

    def installed(name: str) -> bool:
        # A bench module another test imported (served.py, by gpu.py) is found as itself.
        spec = importlib.util.find_spec(name)
        return spec is not None and Path(spec.origin or "").parent != bench

    shadowed = [n for n in names if n in sys.stdlib_module_names or installed(n)]
    assert shadowed == []


def test_check_imports_runs_as_a_script() -> None:
    """The bench run as documented (a script, bench/ first on sys.path) imports its engines."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu.py"),
            "--check-imports",
            "--engines=transformers",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "transformers: imports ok" in out.stdout


def test_llama_8b_shape_has_8b_parameters() -> None:
    bench = load_bench()
    s = bench.LLAMA3_8B
    h, f, n, v = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    kv = h // s["num_attention_heads"] * s["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    total = n * per_layer + 2 * v * h + h
    assert total == pytest.approx(8.03e9, rel=0.01)


@pytest.mark.long
def test_served_bench_smoke_on_cpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--tiny --served``: real `dpicl serve` processes (random weights of the toy shape)
    loaded over HTTP on both routes beside the engine rows, in the engine's own process and
    in the server's, each row written as measured."""
    bench = load_bench()
    out_file = tmp_path / "rows.jsonl"
    bench.main(
        [
            "--device=cpu",
            "--tiny",
            "--served",
            "--servers=served,in-process",
            "--concurrency=1,2",
            "--queries=2",
            "--reps=1",
            f"--out={out_file}",
        ]
    )
    written = [json.loads(line) for line in out_file.read_text().splitlines()]
    served = [w for w in written if "server" in w]
    assert [(w["server"], w["route"], w["concurrency"]) for w in served] == [
        (s, r, c) for s in ("served", "in-process") for r in ("native", "openai") for c in (1, 2)
    ]
    for w in served:
        assert w["calls_per_s"] == pytest.approx(w["queries"] * 10 / w["seconds"])
        assert w["gpu_busy"] is None  # no GPU here
        # The engine's process is measured apart from the server's only where it has one.
        assert (w["engine_cores"] is None) == (w["server"] == "in-process")
    out = capsys.readouterr().out
    assert "served: dtype float32, load format dummy, engine pid" in out
    assert "served native, 2 in flight: served / engine = " in out


def test_shots_give_realistic_prompt_lengths() -> None:
    """``--shots K``: K distinct demonstrations of about 40 tokens per partition, so the
    rows show the prompt lengths users send (issue 46: 8 shots, about 420 tokens)."""
    bench = load_bench()
    from dpicl.engines.models import DEFAULT_CACHE_DIR, resolve_llm

    tok_dir = Path(resolve_llm(None, DEFAULT_CACHE_DIR))
    short = bench.prompt_lengths(tok_dir, None)
    one, eight = bench.prompt_lengths(tok_dir, 1), bench.prompt_lengths(tok_dir, 8)
    per_shot = (statistics.median(eight) - statistics.median(one)) / 7
    assert 35 <= per_shot <= 50
    assert 380 <= statistics.median(eight) <= 460
    assert max(short) < min(eight)
    # Distinct across partitions and shots: no two partitions share a demonstration.
    texts = [e.input for p in range(bench.T) for e in bench.partition_exemplars(p, 8)]
    assert len(set(texts)) == len(texts) == 8 * bench.T


def test_profile_prints_the_split_on_cpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--profile --tiny`` on the CPU: after the row, the host split (tokenising, reads, the
    rest of the batches) and the operator classes with per-batch counts."""
    bench = load_bench()
    rows = bench.main(
        [
            "--device=cpu",
            "--engines=transformers",
            "--models=8b",
            "--tiny",
            "--concurrency=2",
            "--queries=2",
            "--reps=1",
            "--shots=2",
            "--profile",
        ]
    )
    assert [(r.engine, r.concurrency, r.shots) for r in rows] == [("transformers", 2, 2)]
    out = capsys.readouterr().out
    assert "profile transformers tiny-llama, 2 in flight" in out
    assert "tokenising and templating" in out and "reading results back" in out
    assert "batches; kernel launches" in out
    # The CPU operators were seen (the profilers watch the engine's batches in this thread).
    line = next(x for x in out.splitlines() if "device (torch.profiler" in x)
    assert "matmul" in line and " 0.000 s" not in line


def test_kernel_classes() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from engine_profile import kernel_class
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert kernel_class("aten::mm") == "matmul"
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert kernel_class("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kernel_class("void at::native::elementwise_kernel<128, 2>") == "elementwise/copy"
    assert kernel_class("aten::copy_") == "elementwise/copy"
    assert kernel_class("aten::argmax") == "other"
