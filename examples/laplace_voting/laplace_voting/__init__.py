"""Laplace-noise private voting: a DP mechanism added to dpicl from outside its packages.

* :mod:`laplace_voting.server`: the server half, entry point ``laplace-voting`` of group
  ``dpicl.mechanisms`` (settings, calibration, cost event, pipeline, debug view);
* :mod:`laplace_voting.audit`: the auditor half, entry point ``laplace-voting`` of group
  ``dpicl_audit.mechanisms`` (voting's audit with the Laplace noise model).

Neither is imported by this package: each side loads only its own half.
"""
