"""``python -m dpicl_audit.demo`` (``make demo``): audit real dpicl servers end to end.

================  ===============================================================
module            what it holds
================  ===============================================================
:mod:`.servers`   ``python -m dpicl serve`` subprocesses, each with its own database
:mod:`.audits`    the demo's audits: oracle, ESA, the real model planned by power
:mod:`.talk`      what it says while it runs: a line per step, a heartbeat per long one
:mod:`.main`      the script: servers up, audits, servers down, one combined report
================  ===============================================================
"""
