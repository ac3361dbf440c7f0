"""``python -m dpicl_audit.demo`` (``make demo``): audit a real dpicl server end to end.

1. Starts two real ``dpicl serve`` processes on free ports, each with a temporary SQLite
   database, freshly generated tokens and ``DPICL_WHITEBOX=internal``:
   ``DPICL_ENGINE=transformers`` (the bundled SmolLM2-135M-Instruct on CPU) and
   ``DPICL_ENGINE=oracle`` (the labelled rule-following *simulator*, the tight case).
2. Audits private voting through the runner's public API over HTTP only, with the design
   ``auto`` (pivotal canary on the oracle, identical-text design on the real model), at
   epsilon 1, 2, 4 and 8 on the oracle and 4 and 8 on the real model (plus ESA on the
   oracle):

   * bootstrap (Algorithm 1 of paper 000): ``n_llm`` clean vote vectors per world from
     ``/v1/debug/classify``, then 400,000 simulated trials per world, black-box and
     white-box; the noise check confirms the server's reported sigma first;
   * real trials, white-box (noisy votes; the same answers' released labels give the
     black-box estimate too);
   * real trials, black-box through the public ``/v1/classify`` (oracle only: on the CPU
     model every query costs seconds, and its released labels are already in the
     white-box run).

   On the real model each query scores 4 short prompts (one exemplar per partition), so its
   counts are chosen to fit the time budget: ``n_llm`` = 6, then one real run per epsilon,
   planned by power (:mod:`dpicl_audit.estimators.trial_budget`): the bootstrap's figures say about
   how many real trials each epsilon needs before its verdict can be more than
   INCONCLUSIVE; every epsilon gets at least 20, and the rest of the time (at the measured
   rate per trial) goes to the epsilons whose need fits it. Each run is planned again at the
   rate the runs before it measured, and a run that overruns its share of the time (the
   machine got slower) is stopped there; the report uses its logged trials.
3. Stops the servers and writes one combined report (table, JSON, HTML with plots) of all
   runs, and prints where it is.

Options: ``--out DIR`` (default ``runs``), ``--budget SECONDS`` (default 250: the audits,
report and shutdown within the demo's 5 minutes on 2 cores), ``--engines oracle,transformers``,
``--quick`` (tiny counts, for a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from dpicl_audit.demo.audits import Counts, audit_esa, audit_model, audit_oracle
from dpicl_audit.demo.servers import DemoServer
from dpicl_audit.demo.talk import heartbeat, say
from dpicl_audit.report import write_combined_report

__all__ = ["main"]

#: What the demo's INCONCLUSIVE cards add: the demo fits its audits in 5 minutes, so some
#: settings get fewer trials than a verdict needs, and that is the expected outcome.
WHY_INCONCLUSIVE = (
    "expected in this demo: it fits its audits in 5 minutes, so some epsilons get fewer "
    "trials than a verdict needs (the finding says how many would do); not a failure"
)


def _cli_command() -> str:
    """How to call ``dpicl-audit`` here: its name where it is on PATH, else the script
    beside this Python (``.venv/bin/dpicl-audit``, relative to the current directory where
    it lies below it), else ``python -m dpicl_audit.cli``."""
    if shutil.which("dpicl-audit"):
        return "dpicl-audit"
    script = Path(sys.executable).with_name("dpicl-audit")
    if script.exists():
        try:
            return str(script.relative_to(Path.cwd()))
        except ValueError:
            return str(script)
    return f"{sys.executable} -m dpicl_audit.cli"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpicl_audit.demo", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs"), help="output directory")
    parser.add_argument("--budget", type=float, default=250.0, help="seconds for the audits")
    parser.add_argument("--engines", default="oracle,transformers", help="engines to audit")
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ("oracle", "transformers"):
            parser.error(f"--engines: unknown engine {e!r} (oracle, transformers)")
    counts = Counts()
    if args.quick:
        counts = Counts(
            oracle_n_llm=10,
            oracle_trials=40,
            model_n_llm=4,
            model_trials_min=10,
            model_trials_max=10,
            n_sample=20_000,
            esa_oracle_n_llm=2,
        )
    t0 = time.monotonic()
    deadline = t0 + args.budget
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out / f"demo-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    db = out / "audit.db"
    workdir = Path(tempfile.mkdtemp(prefix="dpicl-demo-"))
    admin, user = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    servers = {e: DemoServer(e, workdir, admin, user) for e in engines}
    notes: list[str] = []
    run_ids: list[str] = []
    say(t0, f"starting servers ({', '.join(engines)}); logs and databases in {workdir}")
    for srv in servers.values():
        srv.start()
    try:
        if "oracle" in servers:
            with heartbeat(t0, "waiting for the oracle server"):
                health = servers["oracle"].wait_ready(120)
            say(t0, f"oracle server ready at {servers['oracle'].url}: {health}")
            run_ids += asyncio.run(audit_oracle(servers["oracle"], db, out, counts, t0, notes))
            rid, note = asyncio.run(
                audit_esa(
                    servers["oracle"],
                    db,
                    out,
                    counts.esa_oracle_n_llm,
                    counts.n_sample,
                    t0,
                    model=False,
                )
            )
            run_ids.append(rid)
            notes.append(note)
            servers["oracle"].stop()
        if "transformers" in servers:
            say(t0, "waiting for the transformers server (first load of the model)")
            with heartbeat(t0, "waiting for the transformers server"):
                health = servers["transformers"].wait_ready(600)
            say(t0, f"transformers server ready at {servers['transformers'].url}: {health}")
            run_ids += asyncio.run(
                audit_model(servers["transformers"], db, out, counts, t0, deadline, notes)
            )
    finally:
        for srv in servers.values():
            srv.stop()
        say(t0, "servers stopped")
    notes.append(
        "Every server ran as a separate `python -m dpicl serve` process with "
        "DPICL_WHITEBOX=internal, a temporary SQLite database and generated tokens; the "
        "auditor talked to it over HTTP only. Mechanism: private voting, T=4 partitions, "
        "delta=1e-5, classic calibration, temperature 0, design 'auto': the pivotal canary "
        "(Prompt 1 of paper 000, the other partitions pinned so the canary's partition decides) "
        "on the oracle, the identical-text design (one text in every partition, made-up word "
        "labels, minimal template, pivotal pinning) on the real model. ESA is audited on the "
        "oracle only: on the CPU model each ESA query generates text in every partition, which "
        "does not fit the demo's 5 minutes (see docs/auditing.md)."
    )
    say(t0, "writing the report")
    with heartbeat(t0, "writing the report (estimates and plots)"):
        path = write_combined_report(
            run_ids,
            f"sqlite:///{db}",
            out,
            name="report",
            title="dpicl demo: private voting and ESA audited on the real CPU model and the oracle",
            notes=notes,
            console=Console(),
            why_inconclusive=WHY_INCONCLUSIVE,
        )
    elapsed = time.monotonic() - t0
    print(f"\nreport: {path.resolve()}")
    print(f"table and results: {path.with_name('report.json').resolve()}")
    # The command as it runs from the project's root: .venv/bin is not on PATH unless the
    # environment is activated (issue 45: the demo suggested `dpicl-audit list`).
    cli = _cli_command()
    print(f"trial log: {db.resolve()}  ({cli} list --db {db})")
    print(f"demo finished in {elapsed / 60:.1f} min")
    # The last line, as the first of the report: the overall verdict and the exit status
    # `dpicl-audit report` gives for these runs (the demo itself exits 0 when it ran).
    overall = json.loads(path.with_name("report.json").read_text(encoding="utf-8"))["overall"]
    print(overall["line"])
    return 0
