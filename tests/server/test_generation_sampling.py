"""The transformers engine's next-token sampler (:func:`dpicl.engines.transformers.generation.
sample`) against the softmax it samples from: a chi-square goodness-of-fit test, rejected at
P_REJECT = 1e-4 (the false-failure rate for a correct sampler; the seeds are fixed, so a
given build either passes or fails every time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dpicl.engines.transformers.generation import UNUSABLE, sample

P_REJECT = 1e-4


def test_draws_follow_the_tempered_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(40) * 2.0
    logits[[3, 17]] = float("-inf")  # never drawn
    temperature = 0.7
    probs = torch.softmax(logits.double() / temperature, dim=-1).numpy()
    g = torch.Generator().manual_seed(1)
    rows = 64
    batch = logits.expand(rows, -1)
    draws = [t for _ in range(500) for t in sample(batch, temperature, [g] * rows)]
    counts = np.bincount(draws, minlength=40)
    assert counts[3] == counts[17] == 0
    # Tokens expected fewer than 5 times are pooled into one bin (chi-square's rule).
    expected = probs * len(draws)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    assert big.sum() >= 30
    assert stats.chisquare(observed, expected).pvalue >= P_REJECT


def test_each_row_draws_from_its_own_generator_as_if_alone() -> None:
    torch.manual_seed(2)
    logits = torch.randn(5, 30)
    gens = [torch.Generator().manual_seed(s) for s in (10, 11, 10, 11, 12)]
    a, b, c = gens[0], gens[1], gens[4]
    together = sample(logits, 1.0, [a, b, a, b, c])
    # Rows 0 and 2 share generator 10: drawn together, in order, as that call alone.
    alone_a = sample(logits[[0, 2]], 1.0, [torch.Generator().manual_seed(10)] * 2)
    alone_b = sample(logits[[1, 3]], 1.0, [torch.Generator().manual_seed(11)] * 2)
    alone_c = sample(logits[[4]], 1.0, [torch.Generator().manual_seed(12)])
    assert together == [alone_a[0], alone_b[0], alone_a[1], alone_b[1], alone_c[0]]


def test_greedy_and_non_finite_distributions() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]])
    assert sample(logits, 0.0, [torch.Generator()] * 2) == [1, 0]
    one_hot = torch.tensor([[-1e30, 0.0, -1e30]])
    assert sample(one_hot, 1.0, [torch.Generator().manual_seed(0)]) == [1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_with_an_unusable_distribution_ends_and_moves_no_other_row(
    temperature: float,
) -> None:
    """Not an error (that would release whether a private prompt's numerics failed): the
    row gets UNUSABLE, and the other rows draw exactly what they would without it, their
    generator included."""
    torch.manual_seed(3)
    good = torch.randn(3, 30)
    bad = good.clone()
    bad[1, 4] = float("nan")
    seed = 21
    with_bad = sample(bad, temperature, [torch.Generator().manual_seed(seed)] * 3)
    clean = sample(good, temperature, [torch.Generator().manual_seed(seed)] * 3)
    assert with_bad[1] == UNUSABLE
    assert [with_bad[0], with_bad[2]] == [clean[0], clean[2]]
    if temperature > 0:
        inf_row = good.clone()
        inf_row[2] = float("inf")  # softmax of +inf logits is NaN
        got = sample(inf_row, temperature, [torch.Generator().manual_seed(seed)] * 3)
        assert got[2] == UNUSABLE and got[:2] == clean[:2]
