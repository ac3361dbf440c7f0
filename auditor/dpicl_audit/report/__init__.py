"""Audit reports: a results table (terminal + JSON) and a self-contained HTML file with plots.

:func:`write_report` reports on one run or, given several run ids, on all of them side by
side (the demo puts the real model's runs beside the oracle simulator's). The modules, in the
order data flows:

* :mod:`.data` the runs' results and trials, and the table row type;
* :mod:`.rows` the table rows (one per run, epsilon and threat model; each names mechanism,
  attack, design, method and threat model), with :mod:`.rdp`'s rows of paper 003's audits;
* :mod:`.words` the verdicts in plain words (from :mod:`dpicl_audit.verdicts`);
* :mod:`.table` the terminal table; :mod:`.curves`, :mod:`.plots` and :mod:`.rdp` the figures
  (drawn with :mod:`.figure`); :mod:`.cards`, :mod:`.ledger_section` and :mod:`.probes`
  (the audits from outside) the page's parts;
* :mod:`.utility_card` the privacy-utility card, when ``dpicl-audit utility`` runs are
  reported beside audits (epsilon emp next to the accuracy kept, per setting);
* :mod:`.run_words` the overall verdict line, a run's status and its server in words;
* :mod:`.html` the HTML page; :mod:`.writer` writes it all.
"""

from __future__ import annotations

from dpicl_audit.report.data import ReportRow, RunData, load_run_results
from dpicl_audit.report.rows import report_rows
from dpicl_audit.report.words import run_verdict, verdict_sentence
from dpicl_audit.report.writer import write_combined_report, write_report

__all__ = [
    "ReportRow",
    "RunData",
    "load_run_results",
    "report_rows",
    "run_verdict",
    "verdict_sentence",
    "write_combined_report",
    "write_report",
]
