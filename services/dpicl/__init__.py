"""dpicl: differentially private in-context learning server.

"Paper 000", "paper 003" and "paper 004" in the docstrings are the three papers the project
implements (Xia, Liu, Xiong 2025; Chadha et al., ICML 2024; Flemings et al. 2025, DPS-MOZO);
docs/references.md gives their full citations and every other work cited.

Module map, top down (a layer imports only the layers below it; docs/architecture.md):

* :mod:`~dpicl.cli`: ``dpicl serve | migrate | calibrate | openapi``.
* :mod:`~dpicl.api`: the routes (native, OpenAI-compatible, white-box) and the HTTP
  machinery around them; only the app imports a route.
* :mod:`~dpicl.serving`: what the server does for a request, whichever surface asked:
  create a context, answer a query, list contexts.
* :mod:`~dpicl.spec`: the body of ``POST /v1/contexts`` (mechanism settings from the
  registry).
* :mod:`~dpicl.mechanisms`: the registry and one folder per mechanism (voting, esa,
  dps_mozo): calibration, release maths, cost event, pipeline, debug view, settings.
* :mod:`~dpicl.web`: the route kit (services, who a token acts for, shared shapes).
* :mod:`~dpicl.pipelines`: what the mechanisms' pipelines share.
* :mod:`~dpicl.privacy` and :mod:`~dpicl.prompts`: generic privacy maths, the cost event
  and the ledger; prompt rendering.
* :mod:`~dpicl.engines`, :mod:`~dpicl.store`: the LLM and embedding engines; the database
  (contexts, ledgers, keys, spend rows).
* :mod:`~dpicl.config`, :mod:`~dpicl.domain`, :mod:`~dpicl.metrics`,
  :mod:`~dpicl.logging_setup`, :mod:`~dpicl.errors`.
"""

__version__ = "0.1.0"
