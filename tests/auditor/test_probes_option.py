"""The plan's ``probes`` (``--probes``): which audits from outside a run makes beside its
trials. All by default; a plan that leaves some out runs only the others, and the results,
the console and the report say which were left out (the run could not have seen what they
see), against the real app (oracle engine, in process)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from dpicl_audit.cli.flags import parse_probes
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.pipeline.results import print_results
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.probes.registry import ALL_PROBES, PROBES
from dpicl_audit.report import write_report
from dpicl_audit.results import RunResult
from tests.auditor.test_runner import _plan, _server_missing, oracle_server


def test_the_plan_names_the_probes_the_results_know() -> None:
    assert tuple(PROBES) == ALL_PROBES  # one list, in one order
    assert _plan().probes == ALL_PROBES  # the default: every one
    typed = _plan(probes=["tails", "ledger"]).probes
    assert typed == ("ledger", "tails")  # the one order, whatever was typed
    assert _plan(probes=parse_probes("none")).probes == ()
    assert parse_probes("ledger, surface") == ["ledger", "surface"]
    with pytest.raises(InvalidPlan, match="ledgr"):
        _plan(probes=["ledgr"])
    with pytest.raises(InvalidPlan, match=r"\['tails'\] more than once"):
        _plan(probes=["tails", "tails"])
    stored = AuditPlan.from_public(_plan(probes=["surface"]).public_dump())
    assert stored.probes == ("surface",)  # a resumed run keeps its plan's choice


@pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))
async def test_a_plan_that_leaves_probes_out_runs_only_the_others(tmp_path: Path) -> None:
    plan = _plan(
        **{"mechanism.epsilons": [4.0], "trials": 40, "design": "auto"},
        probes=["ledger", "tails"],
    )
    db = f"sqlite:///{tmp_path}/audit.db"
    async with oracle_server(tmp_path, whitebox="off") as client:
        res = await run_audit(plan, db=db, target=client, out_dir=tmp_path, progress=False)
        left = await client.list_contexts()
    assert left == []  # the probes that ran deleted their contexts
    run = RunResult.from_json(res)
    assert [name for name, _, _ in run.probes()] == ["ledger", "tails"]
    others = [p for p in ALL_PROBES if p not in ("ledger", "tails")]  # in the registry's order
    assert all(name not in res for name in others)
    assert res["probes_left_out"] == others
    assert sorted(run.probe_wall_time_s) == ["ledger", "tails"]  # what each cost
    console = Console(record=True, width=300)
    print_results(res, console)
    said = console.export_text()
    assert f"left out by the plan (--probes): {', '.join(others)}" in said
    assert re.search(r"^tails \(\d+\.\d s\): both labels released", said, re.M), said
    page = write_report(res["run_id"], db, tmp_path / "report").read_text()
    outside = page[page.index("<h2>From outside</h2>") :]
    for name in others:
        assert f"{name}</td><td data-label='status' class=inconclusive>left out</td>" in outside
    assert re.search(
        r"tails</td><td data-label='status' class='ok'>ok</td><td data-label='flags'>no</td>"
        r"<td data-label='s'>\d+\.\d</td>",
        outside,
    )
