"""The DP mechanisms: one folder each, found through :mod:`~dpicl.mechanisms.registry`.

* :mod:`~dpicl.mechanisms.registry`: every mechanism by name (built-ins and those installed
  through the ``dpicl.mechanisms`` entry points); its docstring is the protocol.
* :mod:`~dpicl.mechanisms.base`: the :class:`~dpicl.mechanisms.base.Mechanism` base class
  and the outcome, runtime and token-sink protocols.
* :mod:`~dpicl.mechanisms.partitioned`: what the partition-and-aggregate mechanisms share
  (settings, checks, Gaussian calibration and cost event).
* :mod:`~dpicl.mechanisms.voting`: private voting (paper 000, Algorithm 2).
* :mod:`~dpicl.mechanisms.esa`: embedding space aggregation (paper 000, Algorithm 3).
* :mod:`~dpicl.mechanisms.dps_mozo`: DPS-MOZO (paper 004, Algorithms 1-3), with its offline
  mode and the ``public`` mechanism of the contexts it derives.

Each folder holds the pure release maths (``release.py``: numpy in, numpy out; no I/O, no
engine, and every random choice from a ``rng: np.random.Generator`` argument, seeded from
OS entropy per request by the routes, seeded by tests), its pipeline (``pipeline.py``) and
``mechanism.py``: its settings (the schema fragment of ``POST /v1/contexts``), calibration,
cost event and debug view, as the registered object.
"""
