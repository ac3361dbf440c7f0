"""dpicl: differentially private in-context learning server.

"Paper 000", "paper 003" and "paper 004" in the docstrings are the three papers the project
implements (Xia, Liu, Xiong 2025; Chadha et al., ICML 2024; Flemings et al. 2025, DPS-MOZO);
docs/references.md gives their full citations and every other work cited.

Module map (layers import downward only):

* :mod:`~dpicl.api`: the HTTP layer: app, dependencies, routes, response schemas.
* :mod:`~dpicl.spec`: the body of ``POST /v1/contexts`` (mechanism settings from the
  registry).
* :mod:`~dpicl.pipelines`: context creation and what the mechanisms' pipelines share.
* :mod:`~dpicl.mechanisms`: the registry and one folder per mechanism (voting, esa,
  dps_mozo): calibration, release maths, cost event, pipeline, debug view, settings.
* :mod:`~dpicl.privacy`: generic privacy maths, the cost event and the ledger.
* :mod:`~dpicl.engines`: the LLM and embedding engines.
* :mod:`~dpicl.store`: the database (contexts, ledgers, keys, spend rows).
* :mod:`~dpicl.domain`: the request vocabulary (bounds, text and number types, budgets).
* :mod:`~dpicl.config`, :mod:`~dpicl.errors`, :mod:`~dpicl.cli`, :mod:`~dpicl.prompts`,
  :mod:`~dpicl.metrics`, :mod:`~dpicl.logging_setup`.
"""

__version__ = "0.1.0"
