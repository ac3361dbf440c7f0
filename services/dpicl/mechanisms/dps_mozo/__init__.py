"""DPS-MOZO (paper 004, Algorithms 1-3): one folder.

* :mod:`.release`: the pure per-token maths (mixing, lambda search, product, sampling).
* :mod:`.diagnostics`: exact divergences and log-ratios for the white-box view.
* :mod:`.calibration`: beta of the paper's (nominal) mode, Theorems A.3/A.4.
* :mod:`.proven`: eps0 of the proven mode and its exact composition.
* :mod:`.accounting`: the mechanism's own accountant (epsilon of n answers) and cost event.
* :mod:`.pipeline`: the online decoding pipeline (Algorithm 2).
* :mod:`.offline`: the offline mode (Algorithm 3): synthesis of public demonstrations.
* :mod:`.public`: the ``public`` mechanism that serves them at no privacy cost.
* :mod:`.routes`: ``POST /v1/contexts/{context_id}/synthesize``, the offline mode's route,
  which the mechanism contributes to the API (``Mechanism.routers``).
* :mod:`.mechanism`: settings (schema fragment), calibration record, own budget, debug view;
  the registered :data:`~.mechanism.DPS_MOZO`.
"""
