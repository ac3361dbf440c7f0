"""Where audit plans come from: a TOML file, CLI flags on top of it, the JSON stored with a run.

:class:`~dpicl_audit.plan.AuditPlan` is the model and its validation; this module reads the
sources and hands the merged mapping to :meth:`~dpicl_audit.plan.AuditPlan.from_mapping`
(the plan's ``from_toml``, ``from_sources`` and ``from_public`` call it).

A TOML plan looks like::

    dataset = "news-mini"          # bundled | path.jsonl | path.csv | "hf:<name>"
    canary = "natural"             # natural | mislabeled | random
    setting = "audit-template"     # audit-template | deployment
    threat_model = "white-box"     # black-box | white-box
    attack = "inquery"             # inquery | brainwash
    trials = 2000                  # per epsilon (both worlds together)
    confidence = 0.95
    seed = 7

    [target]
    base_url = "http://127.0.0.1:8000"
    admin_token = "..."            # or DPICL_AUDIT_ADMIN_TOKEN / --admin-token
    api_key = "..."                # optional; the admin token is accepted for /v1/classify
    max_budget_epsilon = 50        # optional; default: the server's /healthz limit, else 1000

    [mechanism]
    epsilons = [1, 2, 4, 8]
    delta = 1e-5
    partitions = 4
    shots = 2
    temperature = 0.0
    calibration = "classic"

    [neighbour]                    # replace-one at one position, shared partition_seed
    position = 3                   # optional; drawn from the seed when absent
    partition_seed = 1234          # optional; drawn from the seed when absent

    [deployment]                   # only for setting = "deployment"
    labels = ["World", "Sports", "Business", "Sci/Tech"]   # default: the dataset's labels
    template = "..."               # default: the server's default template
    positive = "World"             # default: the first label
    negative = "Sports"            # default: the second label

    [bootstrap]
    n_llm = 200
    n_sample = 400000

Generation (ESA) audits set ``mechanism.name = "esa"`` (the dataset then defaults to the
bundled ``dialogsum-mini``) and may add::

    [generation]
    signal = "clock-foxborough"    # a Table 3 pair by name (dpicl_audit.prompts.SIGNAL_PAIRS)
    y1 = "..."                     # or a pair of one's own (both y1 and y0)
    y0 = "..."
    embeddings = "auto"            # where e(y1), e(y0) come from: auto | server | local
    embedder = "/path/to/model"    # local sentence-transformers model; None: bundled MiniLM

DPS-MOZO audits set ``mechanism.name = "dps-mozo"`` (dataset default ``dialogsum-mini``,
``max_tokens`` default 2) and use::

    [mechanism]
    exemplars = 4                  # |D|, canary included
    n_shots = 4                    # default |D| (q = 1)
    top_k = 100
    guarantee = "proven"           # proven (a true (epsilon, delta) claim) | paper (nominal)
    alpha = 8                      # paper mode only; the server's default when absent
    queries_per_context = 1        # a DPS-MOZO context answers this many queries

    [mozo]
    signals = ["red", "blue"]      # the first token meaning present / absent
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpicl_audit.catalog.mechanisms import settings_for
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.jsontypes import JsonObject

__all__ = ["MASK", "MAX_PLAN_BYTES", "plan_data_from_sources", "public_plan_data"]

#: What a stored plan shows in place of a credential.
MASK = "**********"

#: Largest plan file read (a plan is a few kilobytes).
MAX_PLAN_BYTES = 1024 * 1024


def plan_data_from_sources(
    path: str | Path | None, overrides: Mapping[str, Any] | None = None
) -> JsonObject:
    """A TOML file (optional) with dotted-key ``overrides`` (CLI flags) applied on top: the
    plan's data, which :meth:`~dpicl_audit.plan.AuditPlan.from_sources` validates.

    ``overrides`` maps dotted paths (``"mechanism.epsilons"``, ``"target.base_url"``) to
    values; ``None`` values are ignored so unset flags keep the file's values.
    """
    data: JsonObject = {}
    if path is not None:
        p = Path(path)
        try:
            with p.open("rb") as fh:
                # A plan is a few kilobytes; reading "all" of /dev/zero never ends.
                raw = fh.read(MAX_PLAN_BYTES + 1)
        except FileNotFoundError as exc:
            raise InvalidPlan(f"plan file {str(p)!r} does not exist") from exc
        except OSError as exc:  # a directory, no permission, ...
            raise InvalidPlan(f"plan file {str(p)!r} cannot be read: {exc.strerror}") from exc
        if len(raw) > MAX_PLAN_BYTES:
            raise InvalidPlan(
                f"plan file {str(p)!r} is larger than {MAX_PLAN_BYTES} bytes; is it a plan?"
            )
        try:
            data = tomllib.loads(raw.decode())
        except UnicodeDecodeError as exc:
            raise InvalidPlan(
                f"plan file {str(p)!r} is not UTF-8 text (byte "
                f"{raw[exc.start : exc.start + 1]!r} at position {exc.start}); is it a plan?"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise InvalidPlan(f"plan file {str(p)!r} is not valid TOML: {exc}") from exc
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        _set_dotted(data, key, value)
    return data


def public_plan_data(
    data: Mapping[str, Any],
    *,
    admin_token: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
) -> JsonObject:
    """The data of a plan stored by :meth:`~dpicl_audit.plan.AuditPlan.public_dump`, with
    fresh credentials (:meth:`~dpicl_audit.plan.AuditPlan.from_public` validates it)."""
    payload = dict(data)
    target = dict(payload.get("target") or {})
    for key, value in (("admin_token", admin_token), ("api_key", api_key)):
        if value is not None:
            target[key] = value
        elif target.get(key) == MASK:
            target[key] = None
    if base_url is not None:
        target["base_url"] = base_url
    payload["target"] = target
    mech = payload.get("mechanism")
    model = settings_for(str(mech.get("name"))) if isinstance(mech, Mapping) else None
    if isinstance(mech, Mapping) and model is not None:
        # What an older auditor meant where its stored plan has no value (mechanism's own).
        payload["mechanism"] = {**model.stored_defaults, **mech}
    return payload


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value
