"""Measure how often the auditor's defaults flag each realistic fault (issue 27).

Not a test: a script that prints detection rates, for docs/auditing.md. Each repetition
audits the real app in this process (oracle engine, production configuration: unbudgeted
contexts refused) with the fault of ``tests/e2e/broken_realistic_server.py`` patched in, and
counts a run as flagged when its exit status would be 4 or 5 (NONCONFORMING, VIOLATION, BUG).
The exit codes printed are the default gate's (INCONCLUSIVE passes as 0; ``--strict`` prints
``--strict``'s 3 instead); ``left`` counts the contexts the audits left on the server, and
``needs`` the trials each figure without power asks for, ``run i`` each audit's exit code
and wall seconds as it ends (the summary their mean and median), ``tail probe answers``
what the voting noise's tail probe asked (``mechanisms/voting/tails.py``). Faults of
``tests/e2e/broken_surface_server.py`` are known too, those that sit in front of the app
(``leaky_field``, ``temperature_noise`` on the chat route, ``context_version``) with their
ASGI wrapper (:data:`WRAPPERS`). The DPS-MOZO ones (``mozo_one_token``, ``mozo_no_token_limit``,
``racy_queries``) need ``--flags '{"mechanism.name": "dps-mozo"}'``; ``--flags
'{"target.api": "openai"}'`` audits through the OpenAI surface, as ``--api openai`` does.

    python -m tests.e2e.measure_faults --reps 5 [--whitebox off] [--flags '{"trials": 400}']
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dpicl_audit.client import DpiclClient
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.results import RunResult, results_exit_code
from tests.e2e import broken_channel_server as channels
from tests.e2e import broken_realistic_server as faults
from tests.e2e import broken_surface_server as surface
from tests.e2e.test_realistic_faults import production_client
from tests.servers import target_plan

#: The faults that sit in front of the app: their ASGI wrappers.
WRAPPERS = {
    "leaky_field": surface.leaky_app,
    "temperature_noise": surface.temperature_app,
    "context_version": surface.version_app,
}


async def _one(
    fault: str | None, whitebox: str, flags: dict[str, Any], seed: int, strict: bool = False
) -> tuple[int, int, list[str], Any]:
    undo = []
    if fault is not None:
        for module, name, value in (faults.FAULTS | surface.FAULTS | channels.FAULTS)[
            fault
        ].patches:
            undo.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    try:
        with tempfile.TemporaryDirectory() as d:
            openai = flags.get("target.api") == "openai"
            through = OpenAIClient if openai else DpiclClient
            wrap = None if fault is None else WRAPPERS.get(fault)
            async with production_client(Path(d), whitebox, through, wrap) as client:
                plan = target_plan("http://dpicl.test", **(flags | {"seed": seed}))
                try:
                    res = await run_audit(
                        plan, db=f"sqlite:///{d}/a.db", target=client, out_dir=d, progress=False
                    )
                finally:
                    left = len(await client.list_contexts())
        needs = []
        for s in res["settings"]:
            v = (s.get("black_box") or {}).get("verdict") or {}
            if v.get("status") == "inconclusive" and v.get("trials_needed"):
                needs.append(f"{s['setting']}: {sum(v['trials_needed'])}")
        tails = (res.get("tails") or {}).get("answers")
        # Each setting's response-time test (issue 44): the median ratio C1/C0 and p-value.
        timing = [
            f"{s['timing']['median_ratio']:.2f}/p={s['timing']['p_value']:.2g}"
            for s in res["settings"]
            if (s.get("timing") or {}).get("p_value") is not None
        ]
        print(f"  timing {timing}", flush=True)
        # The limits probe (issue 44, item 3): its status and corrected p-value.
        found = res.get("limits") or {}
        print(f"  limits {found.get('status')} p={found.get('p_value')}", flush=True)
        # What flagged the run, if anything (a false alarm of an honest run is diagnosed here).
        run = RunResult.from_json(res)
        flagged = [f"{n}: {sec.get('message')}" for n, sec, st in run.probes() if st is not None]
        flagged += [v.message for v in run.verdicts() if v.status.exit_code in (4, 5)]
        for why in flagged:
            print(f"  flagged by {why[:400]}", flush=True)
        return results_exit_code([res], strict=strict), left, needs, tails
    finally:
        for module, name, value in undo:
            setattr(module, name, value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--whitebox", default="off")
    ap.add_argument("--flags", default="{}")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument(
        "--faults", default="honest,two_partitions,deterministic,correlated,tail_bounded"
    )
    args = ap.parse_args()
    flags = json.loads(args.flags)
    for name in args.faults.split(","):
        fault = None if name == "honest" else name
        got: list[tuple[int, int, list[str], Any]] = []
        walls: list[float] = []
        for i in range(args.reps):
            t0 = time.monotonic()
            got.append(asyncio.run(_one(fault, args.whitebox, flags, 1000 + i, args.strict)))
            walls.append(time.monotonic() - t0)
            # Each run's exit code and wall time as it ends: a long series cut short still
            # says what it measured.
            print(f"  run {i}: exit {got[-1][0]}, {walls[-1]:.1f} s", flush=True)
        codes = [c for c, _, _, _ in got]
        flagged = sum(c in (4, 5) for c in codes)
        print(
            f"{name}: flagged {flagged}/{args.reps} (exit codes {codes}), "
            f"{sum(walls) / args.reps:.1f} s per audit (median {statistics.median(walls):.1f} s), "
            f"left {[n for _, n, _, _ in got]}, needs {[w for _, _, w, _ in got]}, "
            f"tail probe answers {[t for _, _, _, t in got]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
