"""The utility audit (``dpicl-audit utility``): what accuracy a deployed DP-ICL endpoint keeps
at each epsilon and number of partitions, over HTTP, beside its zero-shot and non-private
baselines and the budget the evaluation spent (docs/utility.md).

=====================  ===========================================================
module                 what it holds
=====================  ===========================================================
:mod:`.plan`           the plan, its cells and the deterministic query/exemplar draws
:mod:`.estimators`     accuracy intervals, ROUGE-L and its bootstrap interval (pure)
:mod:`.contexts`       the contexts of a run: created, adopted after a crash, deleted
:mod:`.runner`         the run: queries into the trial log, time estimate, resume
:mod:`.results`        the results, typed: a row per cell, the findings, the whole
:mod:`.report`         results from the trial log, and their table
=====================  ===========================================================
"""

from __future__ import annotations
