"""The DP mechanisms as pure functions over numpy arrays.

Nothing here performs I/O, calls an engine or draws randomness of its own: every random
choice takes a ``rng: np.random.Generator`` argument (the pipelines pass one seeded from OS
entropy per request, tests pass seeded ones). Modules:

* :mod:`~dpicl.mechanisms.partitioning`: exemplars -> T disjoint partitions.
* :mod:`~dpicl.mechanisms.voting.release`: private voting (paper 000, Algorithm 2).
* :mod:`~dpicl.mechanisms.esa.release`: embedding space aggregation (paper 000, Algorithm 3).
* :mod:`~dpicl.mechanisms.dps_mozo.release`: DPS-MOZO (paper 004, Algorithms 1-3).
"""
