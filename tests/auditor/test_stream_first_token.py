"""Where a stream's first token is (probes.answers.stream_started, the surface probe's time to
first token) and the time test on bare samples (estimators.channels.times_test)."""

from __future__ import annotations

import numpy as np

from dpicl_audit.estimators.channels import times_test
from dpicl_audit.probes.answers import stream_started

ROLE = 'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = 'data: {"choices":[{"index":0,"delta":{"content":"Yes"}}]}\n\n'
TEXT = 'data: {"choices":[{"index":0,"text":"No"}]}\n\n'


def test_a_role_only_chunk_is_not_the_first_token() -> None:
    assert not stream_started("")
    assert not stream_started(ROLE)
    assert not stream_started(ROLE + 'data: {"choices":[{"index":0,"de')  # a partial event
    assert stream_started(ROLE + TOKEN)
    assert stream_started(TEXT)  # the completions route's chunks
    assert not stream_started("data: [DONE]\n\n")


def test_times_test_flags_a_world_many_times_slower_given_the_answer() -> None:
    rng = np.random.default_rng(7)
    base = rng.uniform(0.01, 0.02, size=40)
    same = [(i % 2, "Yes", float(t)) for i, t in enumerate(base)]
    found = times_test(same, 1e-4)
    assert found is not None and found["status"] == "ok"
    slow = [(w, a, t * (20.0 if w == 0 else 1.0)) for w, a, t in same]
    found = times_test(slow, 1e-4)
    assert found is not None and found["status"] == "violation" and found["slower"] == "C0"
    assert times_test([(1, "Yes", float("nan"))], 1e-4) is None
