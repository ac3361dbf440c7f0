"""Where DP randomness comes from: a fresh generator per request, seeded from the operating
system's entropy (DESIGN.md section 4). Never a global, engine or fixed seed; tests inject
seeded generators through the pipelines' ``rng`` argument instead.
"""

from __future__ import annotations

import secrets

import numpy as np


def secure_rng() -> np.random.Generator:
    """A PCG64 generator with 128 bits of OS entropy."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def entropy_seed() -> int:
    """A 63-bit seed from OS entropy, for engine samplers (which are not DP noise)."""
    return secrets.randbits(63)
