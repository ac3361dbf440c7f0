"""Positive controls of issue 35: bugs of the kinds a deployed API's surfaces invite.

Each fault is a :class:`tests.e2e.broken_realistic_server.Fault` (``patches``: the (module,
attribute, replacement) triples it installs, for ``monkeypatch``; ``install()`` and
``WARNING`` for ``python -m tests.servers tests.e2e.broken_surface_server:NAME PORT``).

* ``WEAK_CALIBRATION``: private voting's sigma is the paper's classical formula alone,
  without the guard that raises it to the analytic sigma where the formula breaks (epsilon
  above about 8 at delta 1e-5): at epsilon 16 the noise it reports has an exact epsilon of
  18.9. Everything it reports is the truth (sigma, its exact epsilon, the ledger's charges by
  that sigma); only the claim is broken.
"""

from __future__ import annotations

from typing import Any

import dpicl.mechanisms.partitioned as partitioned_mod
from dpicl.privacy.calibration import classic_sigma, sigma_for
from tests.e2e.broken_realistic_server import Fault

_honest_sigma_for = sigma_for


def classic_only_sigma(
    epsilon: float, delta: float, sensitivity: float, calibration: Any = "classic"
) -> float:
    """The classical sigma without the analytic guard (the analytic one when asked for)."""
    if calibration == "classic":
        return classic_sigma(epsilon, delta, sensitivity)
    return _honest_sigma_for(epsilon, delta, sensitivity, calibration)


WEAK_CALIBRATION = Fault(
    ((partitioned_mod, "sigma_for", classic_only_sigma),),
    "the classical sigma without its guard: weaker than claimed above epsilon 8",
)

FAULTS = {"weak_calibration": WEAK_CALIBRATION}
