"""DPS-MOZO benchmarks on the transformers engine (bundled SmolLM2). Ratios from one run.

1. DP overhead: the DPS-MOZO decoding loop (shot sampling, lambda bisection, mixing, product,
   sampling) against plain non-private ensemble decoding of the same shots: the same session
   loop, but the token is drawn from the normalised product of the raw one-shot distributions.
   Both include the prompt prefill and one batched KV-cached forward per token.
2. KV cache: the same DPS-MOZO loop on the cached session (one single-token forward per
   token) against the reference session that re-runs every full prompt plus the suffix at
   each token (``open_decoding(..., recompute=True)``).
3. Session KV layout, on longer answers: the session's keys and values in slots of its own,
   each token written in place (doubling when full), against a transformers
   ``DynamicCache``, which concatenates every token onto the whole cache in every layer
   (the path before; ``engine.slot_caches = False``).

Both sides of a ratio use the same seeded generator, interleaved repetitions and medians,
and are reported in tokens per second (decoding steps, EOS included, per second).

    .venv/bin/python bench/mozo.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from dpicl.engines.base import Engine, Exemplar, PromptSpec
from dpicl.engines.factory import build_engine
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.mechanisms.dps_mozo.calibration import calibrate_beta
from dpicl.mechanisms.dps_mozo.pipeline import mozo_decode
from dpicl.prompts import render

TEMPLATE = "Summarise the dialogue.\n\n{exemplars}\n\nInput: {query}\nOutput:"
DIALOGUES = [
    ("Ann: Lunch at noon? Ben: Sure, see you at the cafe.", "Ann and Ben meet for lunch."),
    ("Tom: Did you send the report? Eva: Yes, this morning.", "Eva sent the report."),
    ("Max: The train is late. Joe: I'll pick you up.", "Joe will pick Max up."),
    ("Sue: Can I borrow your bike? Kim: Of course.", "Kim lends Sue her bike."),
    ("Ian: The meeting moved to Friday. Zoe: Noted, thanks.", "The meeting is on Friday."),
    ("Bob: I lost my keys. Amy: Check the car.", "Amy suggests Bob check the car."),
    ("Lea: Movie tonight? Raj: Only if it's a comedy.", "Raj wants a comedy tonight."),
    ("Dan: Rent is due. Mia: I'll transfer it today.", "Mia will pay the rent today."),
]
QUERY = "Liz: Are we still on for tennis? Pat: Yes, at five, bring the balls."


class Recomputing:
    """The transformers engine, but every decoding session re-runs the full prompts."""

    def __init__(self, engine: TransformersEngine) -> None:
        self._engine = engine
        self.name = engine.name

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> Any:
        return await self._engine.open_decoding(
            prompts, zero_shot_index=zero_shot_index, top_k=top_k, recompute=True
        )


def prompts() -> list[PromptSpec]:
    one = [render(TEMPLATE, [Exemplar(i, o)], QUERY, task="generation") for i, o in DIALOGUES]
    return [*one, render(TEMPLATE, [], QUERY, task="generation")]


async def paired(
    a: Callable[[], Awaitable[int]], b: Callable[[], Awaitable[int]], reps: int
) -> tuple[float, float]:
    """Median tokens per second of a and b (each returns its number of steps), interleaved."""
    ra: list[float] = []
    rb: list[float] = []
    await a()
    await b()  # warm-up
    for _ in range(reps):
        for fn, out in ((a, ra), (b, rb)):
            t0 = time.perf_counter()
            steps = await fn()
            out.append(steps / (time.perf_counter() - t0))
    return statistics.median(ra), statistics.median(rb)


async def main(quick: bool) -> None:
    tf = build_engine(
        "transformers", model=None, cache_dir=Path.home() / ".cache/dpicl", device="cpu"
    )
    assert isinstance(tf, TransformersEngine)
    ps = prompts()
    n_shots, top_k, t_max, t_long = 4, 100, 8 if quick else 16, 16 if quick else 64
    cal = calibrate_beta(
        4.0, 1 / len(DIALOGUES), None, tokens=10 * t_long, sample_rate=n_shots / len(DIALOGUES)
    )

    def loop(engine: Engine, *, private: bool, tokens: int = t_max) -> Callable[[], Awaitable[int]]:
        async def run() -> int:
            out = await mozo_decode(
                engine,
                ps,
                n_shots=n_shots,
                top_k=top_k,
                max_tokens=tokens,
                beta=cal.beta,
                alpha=cal.alpha,
                lam_max=1.5,
                rng=np.random.default_rng(0),
                private=private,
            )
            return len(out.token_ids) + int(out.eos)

        return run

    reps = 3 if quick else 7
    dp, plain = await paired(loop(tf, private=True), loop(tf, private=False), reps)
    print(
        f"DPS-MOZO {dp:6.2f} tok/s vs non-private ensemble {plain:6.2f} tok/s -> ratio "
        f"{plain / dp:.3f} ({(plain / dp - 1) * 100:+.1f}% time for the DP part: lambda "
        f"bisection + mixing over {n_shots} shots x top-{top_k}, same session loop)"
    )
    slow = cast(Engine, Recomputing(tf))
    cached, full = await paired(loop(tf, private=True), loop(slow, private=True), reps)
    print(
        f"KV-cache loop {cached:6.2f} tok/s vs recompute {full:6.2f} tok/s -> speed-up "
        f"x{cached / full:.2f} (one single-token forward of {len(ps)} rows per token instead "
        f"of re-running {len(ps)} full prompts; T_max={t_max})"
    )

    def concatenating(run: Callable[[], Awaitable[int]]) -> Callable[[], Awaitable[int]]:
        async def wrapped() -> int:
            tf.slot_caches = False
            try:
                return await run()
            finally:
                tf.slot_caches = True

        return wrapped

    long = loop(tf, private=True, tokens=t_long)
    slots, cat = await paired(long, concatenating(long), min(reps, 5))
    print(
        f"session KV in slots {slots:6.2f} tok/s vs concatenated (DynamicCache) {cat:6.2f} "
        f"tok/s -> speed-up x{slots / cat:.2f} ({len(ps)} rows, T_max={t_long})"
    )
    await tf.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    asyncio.run(main(ap.parse_args().quick))
