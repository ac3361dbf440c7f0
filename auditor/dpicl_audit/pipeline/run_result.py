"""The typed results' old home, kept for code that imports them from here: they live in
:mod:`dpicl_audit.results` (below the mechanisms, which build them)."""

from __future__ import annotations

from dpicl_audit.results import Estimate, RunResult, SettingResult, results_exit_code

__all__ = ["Estimate", "RunResult", "SettingResult", "results_exit_code"]
