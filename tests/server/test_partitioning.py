"""Partition assignment (dpicl.pipelines.partitioning): the structural fact behind the
sensitivity bound, "neighbouring contexts differ in one partition", as property tests.
Hypothesis runs derandomized, so every test here is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from dpicl.errors import ConfigurationError
from dpicl.pipelines.partitioning import (
    assign_partitions,
    group_by_partition,
    partition_sizes,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)

texts = st.text(max_size=8)
exemplar = st.tuples(texts, st.sampled_from(["Yes", "No", "Maybe"]))


Contents = list[list[tuple[str, str]]]


def contents(exemplars: list[tuple[str, str]], partitions: int, seed: int, scheme: str) -> Contents:
    """Each partition's exemplars as a sorted list (what the engine gets, up to order)."""
    ids = assign_partitions(exemplars, partitions, seed, scheme)  # type: ignore[arg-type]
    return [sorted(exemplars[i] for i in g) for g in group_by_partition(ids, partitions)]


def n_differing(a: Contents, b: Contents) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


@SETTINGS
@given(
    n=st.integers(min_value=1, max_value=300),
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**64),
)
def test_positional_sizes_are_balanced(n: int, data: st.DataObject, seed: int) -> None:
    t = data.draw(st.integers(min_value=1, max_value=n))
    ids = assign_partitions(n, t, seed)
    sizes = partition_sizes(ids, t)
    assert sizes.sum() == n
    assert sizes.max() - sizes.min() <= 1
    assert sizes.min() >= 1


@SETTINGS
@given(
    exemplars=st.lists(exemplar, min_size=1, max_size=40),
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**63),
    replacement=exemplar,
)
def test_positional_replace_one_changes_exactly_one_partition(
    exemplars: list[tuple[str, str]], data: st.DataObject, seed: int, replacement: tuple[str, str]
) -> None:
    n = len(exemplars)
    t = data.draw(st.integers(min_value=1, max_value=n))
    pos = data.draw(st.integers(min_value=0, max_value=n - 1))
    neighbour = list(exemplars)
    neighbour[pos] = replacement
    # Same n, T and seed: the assignment itself is identical...
    ids = assign_partitions(exemplars, t, seed)
    assert np.array_equal(ids, assign_partitions(neighbour, t, seed))
    assert np.array_equal(ids, assign_partitions(n, t, seed))
    # ...so exactly the partition holding the replaced position changes (none if the
    # replacement equals the original).
    a, b = contents(exemplars, t, seed, "positional"), contents(neighbour, t, seed, "positional")
    expected = 0 if replacement == exemplars[pos] else 1
    assert n_differing(a, b) == expected
    if expected:
        assert a[int(ids[pos])] != b[int(ids[pos])]


@SETTINGS
@given(
    exemplars=st.lists(exemplar, min_size=1, max_size=40),
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**63),
    partitions=st.integers(min_value=1, max_value=12),
)
def test_hash_remove_one_moves_only_that_exemplar(
    exemplars: list[tuple[str, str]], data: st.DataObject, seed: int, partitions: int
) -> None:
    pos = data.draw(st.integers(min_value=0, max_value=len(exemplars) - 1))
    smaller = exemplars[:pos] + exemplars[pos + 1 :]
    ids = assign_partitions(exemplars, partitions, seed, "hash")
    ids_smaller = assign_partitions(smaller, partitions, seed, "hash")
    # Every other exemplar keeps its partition...
    assert np.array_equal(np.delete(ids, pos), ids_smaller)
    # ...so the partitions differ in exactly one place (add is the same pair reversed).
    a = contents(exemplars, partitions, seed, "hash")
    b = contents(smaller, partitions, seed, "hash")
    assert n_differing(a, b) == 1
    assert a[int(ids[pos])] != b[int(ids[pos])]


@SETTINGS
@given(
    exemplars=st.lists(exemplar, min_size=0, max_size=40),
    new=exemplar,
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**63),
    partitions=st.integers(min_value=1, max_value=12),
)
def test_hash_add_one_moves_only_that_exemplar(
    exemplars: list[tuple[str, str]],
    new: tuple[str, str],
    data: st.DataObject,
    seed: int,
    partitions: int,
) -> None:
    pos = data.draw(st.integers(min_value=0, max_value=len(exemplars)))
    bigger = [*exemplars[:pos], new, *exemplars[pos:]]
    ids = assign_partitions(exemplars, partitions, seed, "hash")
    ids_bigger = assign_partitions(bigger, partitions, seed, "hash")
    assert np.array_equal(np.delete(ids_bigger, pos), ids)
    a = contents(exemplars, partitions, seed, "hash")
    b = contents(bigger, partitions, seed, "hash")
    assert n_differing(a, b) == 1


@SETTINGS
@given(
    exemplars=st.lists(exemplar, min_size=1, max_size=30),
    replacement=exemplar,
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**63),
    partitions=st.integers(min_value=1, max_value=12),
)
def test_hash_replace_one_touches_at_most_two_partitions(
    exemplars: list[tuple[str, str]],
    replacement: tuple[str, str],
    data: st.DataObject,
    seed: int,
    partitions: int,
) -> None:
    # Documented limit: a replacement is a removal plus an addition.
    pos = data.draw(st.integers(min_value=0, max_value=len(exemplars) - 1))
    neighbour = list(exemplars)
    neighbour[pos] = replacement
    a = contents(exemplars, partitions, seed, "hash")
    b = contents(neighbour, partitions, seed, "hash")
    assert n_differing(a, b) <= 2


def test_positional_is_not_safe_under_add_remove() -> None:
    # The documented caveat, demonstrated: removing one exemplar reshuffles the others.
    exemplars = [(f"input {i}", "Yes" if i % 2 else "No") for i in range(40)]
    a = contents(exemplars, 8, 1234, "positional")
    b = contents(exemplars[1:], 8, 1234, "positional")
    assert n_differing(a, b) > 1


def test_hash_depends_on_seed_and_contents_only() -> None:
    exemplars = [(f"q{i}", "Yes") for i in range(50)]
    ids = assign_partitions(exemplars, 5, 7, "hash")
    assert np.array_equal(ids, assign_partitions(list(reversed(exemplars)), 5, 7, "hash")[::-1])
    assert not np.array_equal(ids, assign_partitions(exemplars, 5, 8, "hash"))
    # Length-prefixed encoding: the split between input and output matters.
    one = assign_partitions([("ab", "c")] * 1, 2**20, 3, "hash")
    two = assign_partitions([("a", "bc")] * 1, 2**20, 3, "hash")
    assert one[0] != two[0]


def test_hash_partitions_are_roughly_uniform() -> None:
    # Chi-square goodness of fit of 20,000 hashed exemplars over 10 partitions.
    # False-failure rate 1e-4 if the keyed hash behaves as a random function (the inputs
    # are fixed, so the outcome is deterministic).
    exemplars = [(f"exemplar number {i}", "Yes") for i in range(20_000)]
    sizes = partition_sizes(assign_partitions(exemplars, 10, 99, "hash"), 10)
    assert chisquare(sizes).pvalue > 1e-4


def test_positional_is_deterministic_and_seed_dependent() -> None:
    a = assign_partitions(30, 4, 11)
    assert np.array_equal(a, assign_partitions(30, 4, 11))
    assert not np.array_equal(a, assign_partitions(30, 4, 12))
    assert a.dtype == np.int64
    assert set(a.tolist()) == {0, 1, 2, 3}


def test_group_by_partition_lists_positions_in_order() -> None:
    ids = np.array([2, 0, 2, 1, 0, 2], dtype=np.int64)
    groups = group_by_partition(ids, 4)
    assert [g.tolist() for g in groups] == [[1, 4], [3], [0, 2, 5], []]
    assert all(g.dtype == np.int64 for g in groups)
    assert group_by_partition(np.zeros(0, dtype=np.int64), 2)[0].size == 0
    with pytest.raises(ValueError, match="partition ids"):
        group_by_partition(np.array([0, 3]), 3)


@pytest.mark.parametrize(("n", "t", "shown"), [(10, 0, "0"), (10, -2, "-2"), (5, 6, "6")])
def test_bad_partition_counts_are_configuration_errors(n: int, t: int, shown: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        assign_partitions(n, t, 1)
    assert info.value.param == "mechanism.partitions"
    assert shown in info.value.message


def test_hash_allows_more_partitions_than_exemplars_but_not_zero() -> None:
    ids = assign_partitions([("a", "Yes"), ("b", "No")], 5, 1, "hash")
    assert ids.shape == (2,)
    assert ((ids >= 0) & (ids < 5)).all()
    with pytest.raises(ConfigurationError) as info:
        assign_partitions([("a", "Yes")], 0, 1, "hash")
    assert info.value.param == "mechanism.partitions"


def test_other_validation() -> None:
    with pytest.raises(ConfigurationError) as info:
        assign_partitions(10, 2, -1)
    assert info.value.param == "mechanism.partition_seed"
    assert "-1" in info.value.message
    with pytest.raises(ConfigurationError) as info:
        assign_partitions(10, 2, 1, "random")  # type: ignore[arg-type]
    assert info.value.param == "mechanism.partitioning"
    assert "random" in info.value.message
    with pytest.raises(TypeError):
        assign_partitions(10, 2, 1, "hash")
