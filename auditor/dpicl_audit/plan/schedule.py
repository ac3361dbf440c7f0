"""The trial schedule: run ids, each trial's world, and the random streams of a run.

Every random choice of the auditor is drawn from the plan's ``seed`` on its own stream, so a
resumed run continues exactly where it stopped (the world of trial ``i`` never changes).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput

__all__ = [
    "CLEAN_SETTING",
    "STREAM_BOOTSTRAP",
    "STREAM_ORDER",
    "STREAM_SCHEDULE",
    "STREAM_SPLIT",
    "check_run_id",
    "clean_worlds",
    "context_slots",
    "new_run_id",
    "trial_worlds",
]

#: The trial log's setting of a bootstrap run's clean collection.
CLEAN_SETTING = "clean"

# Independent random streams derived from the plan's seed (the design uses its own).
STREAM_SCHEDULE = 0x5C_4ED0
STREAM_SPLIT = 0x5B_1170
STREAM_BOOTSTRAP = 0xB0_0757
#: The permutations of the answer-order test (estimators.exchangeable).
STREAM_ORDER = 0x0D_E7ED


def new_run_id() -> str:
    """``audit-YYYYmmdd-HHMMSS-xxxxxx`` (UTC), unique enough for one trial log."""
    return f"audit-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


#: What a run id may be: it names a directory (``<out>/<run id>/``) and a key of the log.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def check_run_id(run_id: str) -> str:
    """``run_id`` if it can name a run; else :class:`InvalidAuditInput` naming it (a run id
    such as ``../../x`` would have put the results outside ``--out``)."""
    if RUN_ID.fullmatch(run_id) is None:
        raise InvalidAuditInput(
            f"run id {run_id[:100]!r} must be 1 to 80 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def trial_worlds(seed: int, setting_index: int, n: int) -> npt.NDArray[np.int8]:
    """The world (1 = C1, 0 = C0) of every trial index: fair coins from the plan's seed."""
    rng = np.random.default_rng([seed, STREAM_SCHEDULE, setting_index])
    return rng.integers(0, 2, size=n).astype(np.int8)


def clean_worlds(n_llm: int) -> npt.NDArray[np.int8]:
    """Bootstrap collection: indices alternate C1, C0, C1, ... (n_llm of each)."""
    return (1 - np.arange(2 * n_llm) % 2).astype(np.int8)


def context_slots(worlds: npt.NDArray[np.int8], per_context: int | None) -> list[int]:
    """Which context of its world each trial goes to.

    ``None``: one context per world serves every trial. ``q``: a context answers ``q``
    queries and is then spent (DPS-MOZO; voting and ESA where one budget cannot hold a world's
    trials), so the j-th trial of a world goes to that world's context ``j // q``.
    """
    if per_context is None:
        return [0] * len(worlds)
    seen = [0, 0]
    out = []
    for w in worlds:
        out.append(seen[int(w)] // per_context)
        seen[int(w)] += 1
    return out
