"""Splitting a context's exemplars into T disjoint partitions (paper 000, Algorithm 2 line 1
and Algorithm 3 line 1).

The privacy proofs of voting and ESA rest on one structural fact: neighbouring contexts
differ in *one* partition, so one partition's vote (or embedding) is all that can change.
Which neighbours that holds for depends on how exemplars are assigned (DESIGN.md section 4,
"Adjacency"):

``"positional"`` (the default)
    A permutation of the positions 0..n-1 seeded by ``seed``, then round-robin: the k-th
    position of the permutation goes to partition ``k mod T``. Sizes differ by at most one.
    The assignment depends only on (n, T, seed), never on the exemplars' contents, so two
    contexts of the same size and seed that differ at one position (replace-one adjacency,
    the one paper 000 audits in Section 3.2: the canary takes the place of one exemplar)
    differ in exactly one partition. **Not safe under add/remove adjacency**: adding or
    removing an exemplar changes n and with it the whole permutation, so every partition
    may change and the sensitivity bound of Delta2 = sqrt(2) no longer holds.

``"hash"``
    Partition = keyed BLAKE2b(seed; input, output) mod T. Each exemplar's partition depends
    only on its own contents and the seed, so adding or removing one exemplar changes only
    the partition that exemplar hashes to: add/remove neighbours differ in one partition.
    A replacement is a removal plus an addition and may touch *two* partitions (the old
    exemplar's and the new one's); under replace-one adjacency the hash scheme therefore
    needs twice the voting sensitivity (two votes can move: Delta2 = 2). The price of the
    scheme is unequal partition sizes (multinomial, not balanced) and possibly empty
    partitions; ids are returned anyway and callers handle empty partitions. Identical
    exemplars always share a partition.

The seed is public structure, not DP noise: it is stored with the context and may be
chosen by the provider. The privacy guarantee holds for every fixed seed, which is why
seeding a generator from it is correct here (and is the only place in ``services/`` where a
generator is seeded from a caller-supplied value).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from dpicl.errors import ConfigurationError

__all__ = [
    "MAX_SEED",
    "PartitionScheme",
    "assign_partitions",
    "group_by_partition",
    "partition_sizes",
]

PartitionScheme = Literal["positional", "hash"]
IntArray = npt.NDArray[np.int64]

#: Seeds must lie in [0, MAX_SEED): 128 bits are plenty and fit a BLAKE2b key.
MAX_SEED = 2**128

_PARAM_T = "mechanism.partitions"
_PARAM_SEED = "mechanism.partition_seed"
_PARAM_SCHEME = "mechanism.partitioning"


def _check_seed(seed: int) -> int:
    try:
        value = operator.index(seed)
    except TypeError:
        raise ConfigurationError(
            f"partition_seed must be an integer, got {seed!r}", param=_PARAM_SEED
        ) from None
    if isinstance(seed, bool) or not 0 <= value < MAX_SEED:
        raise ConfigurationError(
            f"partition_seed must be an integer in [0, 2**128), got {seed!r}", param=_PARAM_SEED
        )
    return value


def _check_partitions(partitions: int) -> int:
    try:
        t = operator.index(partitions)
    except TypeError:
        raise ConfigurationError(
            f"partitions must be an integer, got {partitions!r}", param=_PARAM_T
        ) from None
    if isinstance(partitions, bool) or t < 1:
        raise ConfigurationError(f"partitions must be >= 1, got {partitions!r}", param=_PARAM_T)
    return t


def _positional(n: int, partitions: int, seed: int) -> IntArray:
    # Public structure, not DP noise: the guarantee holds for every fixed seed, so a
    # generator seeded by the (stored, possibly user-chosen) partition seed is correct.
    perm = np.random.default_rng(seed).permutation(n)
    ids = np.empty(n, dtype=np.int64)
    # Round-robin over the permuted order: partition sizes are floor(n/T) or ceil(n/T).
    ids[perm] = np.arange(n, dtype=np.int64) % partitions
    return ids


def _encode(text: str) -> bytes:
    raw = text.encode("utf-8")
    # Length-prefixed so that ("ab", "c") and ("a", "bc") hash differently.
    return len(raw).to_bytes(8, "big") + raw


def _hash(exemplars: Sequence[tuple[str, str]], partitions: int, seed: int) -> IntArray:
    key = seed.to_bytes(16, "big")
    ids = np.empty(len(exemplars), dtype=np.int64)
    for k, pair in enumerate(exemplars):
        if len(pair) != 2 or not all(isinstance(s, str) for s in pair):
            raise TypeError(f"exemplar {k} must be an (input, output) pair of strings")
        digest = hashlib.blake2b(
            _encode(pair[0]) + _encode(pair[1]), key=key, digest_size=8, person=b"dpicl-part"
        ).digest()
        # A 64-bit digest mod T: the modulo bias is below T / 2**64, negligible (and public).
        ids[k] = int.from_bytes(digest, "big") % partitions
    return ids


def assign_partitions(
    exemplars: Sequence[tuple[str, str]] | int,
    partitions: int,
    seed: int,
    scheme: PartitionScheme = "positional",
) -> IntArray:
    """The partition id (0..T-1) of each exemplar position, for T = ``partitions``.

    ``exemplars`` is the context's (input, output) pairs, or for the positional scheme just
    their number n. See the module docstring for which adjacency each scheme protects.

    Raises :class:`~dpicl.errors.ConfigurationError` (``param="mechanism.partitions"``) for
    T < 1 or, positional, T > n; for a seed outside [0, 2**128) or an unknown scheme.
    """
    t = _check_partitions(partitions)
    s = _check_seed(seed)
    if scheme not in get_args(PartitionScheme):
        raise ConfigurationError(
            f"partitioning must be one of {list(get_args(PartitionScheme))}, got {scheme!r}",
            param=_PARAM_SCHEME,
        )
    if scheme == "hash":
        if isinstance(exemplars, int):
            raise TypeError("the hash scheme needs the exemplars themselves, not their number")
        return _hash(exemplars, t, s)
    n = exemplars if isinstance(exemplars, int) else len(exemplars)
    if n < 0:
        raise ValueError(f"number of exemplars must be >= 0, got {n}")
    if t > n:
        raise ConfigurationError(
            f"partitions={t} exceeds the number of exemplars ({n}); every partition needs at "
            "least one exemplar",
            param=_PARAM_T,
        )
    return _positional(n, t, s)


def _check_ids(ids: npt.ArrayLike, partitions: int) -> tuple[IntArray, int]:
    t = _check_partitions(partitions)
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"partition ids must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= t):
        raise ValueError(f"partition ids must lie in [0, {t}), got [{arr.min()}, {arr.max()}]")
    return arr, t


def group_by_partition(ids: npt.ArrayLike, partitions: int) -> list[IntArray]:
    """Positions of each partition, in position order: ``result[t]`` lists the positions
    whose id is t (possibly empty, for the hash scheme)."""
    arr, t = _check_ids(ids, partitions)
    order = np.argsort(arr, kind="stable")  # stable: positions stay increasing in a group
    bounds = np.cumsum(np.bincount(arr, minlength=t))[:-1]
    return [g.astype(np.int64, copy=False) for g in np.split(order, bounds)]


def partition_sizes(ids: npt.ArrayLike, partitions: int) -> IntArray:
    """Number of exemplars in each partition."""
    arr, t = _check_ids(ids, partitions)
    return np.bincount(arr, minlength=t).astype(np.int64)
