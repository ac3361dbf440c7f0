"""Embedding space aggregation (paper 000, Algorithm 3; paper 004, Algorithm 4): one folder.

* :mod:`.release`: the pure release maths (sensitivity, noisy mean, nearest candidate).
* :mod:`.pipeline`: the request pipeline (partition and zero-shot generations -> embeddings
  -> release).
* :mod:`.mechanism`: settings (schema fragment), calibration, cost event, debug view; the
  registered :data:`~.mechanism.ESA`.

The release maths' names are importable from the package itself, as before the folder.
"""

from dpicl.mechanisms.esa import release
from dpicl.mechanisms.esa.release import *  # noqa: F403

__all__ = release.__all__
