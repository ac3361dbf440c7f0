"""Private voting (paper 000, Algorithm 2): one folder.

* :mod:`.release`: the pure release maths (votes, histogram, noisy argmax, its exact law).
* :mod:`.pipeline`: the request pipeline (partition prompts -> label scores -> release).
* :mod:`.mechanism`: settings (schema fragment), calibration, cost event, debug view; the
  registered :data:`~.mechanism.VOTING`.

The release maths' names are importable from the package itself, as before the folder.
"""

from dpicl.mechanisms.voting import release
from dpicl.mechanisms.voting.release import *  # noqa: F403

__all__ = release.__all__
