"""What a default audit of one epsilon costs: this checkout against another (issue 35's "within
twice today's wall time on the oracle engine").

For each tree, in turn (A B A B ...: machines are shared and noisy), a real ``dpicl serve``
process (oracle engine, production configuration: budgets required) is started from that
tree, ``dpicl-audit run --epsilons 4`` (the default plan otherwise: 1,000 trials, every probe)
runs against it from the same tree, and the server is stopped. Printed: per tree the median
of the audit command's whole wall time (start-up included, what a user waits for) and of the
run's own ``wall_time_s`` (trials, estimates and probes), and the ratios A/B of both medians,
then each probe's median seconds per tree (``probe_wall_time_s``: where the difference is).

    python bench/one_epsilon_audit.py --baseline /path/to/other/checkout [--pairs 5]

The baseline is a checkout (a git worktree: ``git worktree add /tmp/base 0c70bc0^``) that
runs with this checkout's virtual environment (its code on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"dpicl serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def one_audit(tree: Path) -> tuple[float, float, dict[str, float]]:
    """(the audit command's wall seconds, the run's own wall_time_s, each probe's seconds)
    against a fresh server."""
    env = os.environ | {
        "PYTHONPATH": f"{tree}/services:{tree}/auditor",
        "HF_HUB_OFFLINE": "1",
        "DPICL_ENGINE": "oracle",
        "DPICL_ADMIN_TOKEN": "bench-admin",
        "DPICL_API_KEYS": "bench-user",
    }
    port = _free_port()
    with tempfile.TemporaryDirectory() as d:
        env["DPICL_DATABASE_URL"] = f"sqlite:///{d}/server.db"
        serve = [sys.executable, "-c", "from dpicl.cli import app; app()", "serve"]
        server = subprocess.Popen(
            [*serve, "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait(url, server)
            audit = [sys.executable, "-m", "dpicl_audit.cli", "run", "--url", url]
            audit += ["--admin-token", "bench-admin", "--api-key", "bench-user"]
            audit += ["--epsilons", "4", "--db", f"sqlite:///{d}/audit.db", "--out", f"{d}/runs"]
            t0 = time.monotonic()
            done = subprocess.run(
                [*audit, "--json"], env=env, cwd=d, capture_output=True, check=False
            )
            wall = time.monotonic() - t0
            if done.returncode != 0:
                # What flagged: the console's findings, so that a failure in CI says why.
                said = done.stderr.decode(errors="replace")[-4000:]
                raise RuntimeError(f"the audit of {tree} exited {done.returncode}:\n{said}")
            results = json.loads(done.stdout)
            probes = {str(k): float(v) for k, v in (results.get("probe_wall_time_s") or {}).items()}
            return wall, float(results["wall_time_s"]), probes
        finally:
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the other checkout (B)")
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    trees = {"A (this checkout)": HERE, f"B ({args.baseline})": args.baseline.resolve()}
    got: dict[str, list[tuple[float, float, dict[str, float]]]] = {k: [] for k in trees}
    for _ in range(args.pairs):
        for name, tree in trees.items():
            got[name].append(one_audit(tree))
    medians = {}
    for name, runs in got.items():
        whole = statistics.median(w for w, _, _ in runs)
        own = statistics.median(r for _, r, _ in runs)
        medians[name] = (whole, own)
        print(f"{name}: audit command {whole:.1f} s, the run's wall_time_s {own:.1f} s (median)")
    (a_whole, a_own), (b_whole, b_own) = medians.values()
    print(f"A/B: audit command {a_whole / b_whole:.2f}, run wall_time_s {a_own / b_own:.2f}")
    for name, runs in got.items():
        names = sorted({p for _, _, probes in runs for p in probes})
        each = {p: statistics.median(probes.get(p, 0.0) for _, _, probes in runs) for p in names}
        print(f"{name} probes (median s): " + ", ".join(f"{p} {t:.1f}" for p, t in each.items()))


if __name__ == "__main__":
    main()
