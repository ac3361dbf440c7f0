"""Check a utility run's figures against the trial log, apart from the auditor's code: plain
SQL on the SQLite log, scipy's beta quantiles for the exact interval, and a re-count of each
answer against the dataset's label as logged. Prints one line per cell and exits 1 on any
difference (issue 37: "its intervals and baselines check out against an independent
computation from the trial log").

    .venv/bin/python bench/utility_check.py RUN_ID --db runs/audit.db \
        --results runs/RUN_ID/utility.json
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys

from scipy.stats import beta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_id")
    ap.add_argument("--db", required=True, help="the SQLite trial log (a path)")
    ap.add_argument("--results", required=True, help="the run's utility.json")
    args = ap.parse_args()
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    cells = {c["setting"]: c for c in results["cells"]}
    con = sqlite3.connect(args.db)
    rows = con.execute(
        "SELECT setting, count(*), count(DISTINCT trial_index), "
        "sum(json_extract(observation, '$.label') = json_extract(observation, '$.expected')), "
        "max(json_extract(observation, '$.budget.spent_epsilon')), "
        "group_concat(DISTINCT json_extract(observation, '$.route')) "
        "FROM trials WHERE run_id = ? GROUP BY setting ORDER BY setting",
        (args.run_id,),
    ).fetchall()
    bad = 0
    for setting, n, distinct, k, spent, route in rows:
        k = int(k or 0)
        low = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
        high = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
        got = cells[setting]["accuracy"]
        ok = (
            n == distinct == got["n"]
            and math.isclose(got["value"], k / n, abs_tol=1e-12)
            and math.isclose(got["low"], low, abs_tol=1e-9)
            and math.isclose(got["high"], high, abs_tol=1e-9)
            and (spent is None) == (cells[setting]["spent_epsilon"] is None)
            and (spent is None or math.isclose(spent, cells[setting]["spent_epsilon"]))
        )
        bad += not ok
        print(
            f"{'ok ' if ok else 'BAD'} {setting:10} n={n} correct={k} "
            f"[{low:.3f}, {high:.3f}] spent={spent} via {route}"
        )
    return 1 if bad or len(rows) != len([c for c in cells.values() if c["queries"]]) else 0


if __name__ == "__main__":
    sys.exit(main())
