"""The ``run``/``bootstrap`` options, in the groups that ``--help`` shows as panels.

Each :class:`Flag` is one option: its parameter (type, ``typer.Option``) and the dotted plan
path it overrides (:meth:`~dpicl_audit.plan.AuditPlan.from_sources`), or none where the
command reads it itself (``--db``, ``--json``). Each group function returns one panel's
flags; :func:`plan_overrides` turns the parsed values into the plan's overrides.
"""

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import typer

from dpicl_audit.catalog.attacks import ATTACKS, Attack, mechanisms_taking
from dpicl_audit.cli.common import (
    AdminOpt,
    DbOpt,
    DeploymentOpt,
    JsonOpt,
    KeyOpt,
    OutOpt,
    ProfileOpt,
    ProgressOpt,
    SplitOpt,
    StrictOpt,
    UrlOpt,
)
from dpicl_audit.cli.flags import (
    Flag,
    own_flag,
    parse_floats,
    parse_probes,
    parse_strings,
    plan_flag,
    shared_flag,
)
from dpicl_audit.plan import (
    Calibration,
    CanaryKind,
    EmbeddingSource,
    Setting,
    ThreatModel,
    VotingDesign,
)
from dpicl_audit.probes.registry import ALL_PROBES
from dpicl_audit.store.db import DEFAULT_DB

__all__ = ["AUDIT_GROUPS", "audit_parameters", "plan_overrides"]


def target_flags() -> list[Flag]:
    """Where the plan comes from and which server, with which credentials and API."""
    return [
        Flag(
            "plan",
            Path | None,
            typer.Option("--plan", help="TOML plan; flags override it. (default: none)"),
        ),
        shared_flag("url", UrlOpt, "target.base_url"),
        shared_flag("admin_token", AdminOpt, "target.admin_token"),
        shared_flag("api_key", KeyOpt, "target.api_key"),
        plan_flag(
            "api",
            str | None,
            "target.api",
            "native: /v1/classify, /v1/generate | openai: "
            "chat completions, the answer read from choices (black-box only)",
        ),
        own_flag(
            "context_hook",
            str | None,
            "target.context_hook",
            "With --api openai: a Python entry point module:function or a command that "
            "receives each context (JSON) and returns the model id to query, instead "
            "of POST /v1/contexts. (default: none)",
        ),
    ]


def audit_flags() -> list[Flag]:
    """What is audited: the mechanism, the data, the canary, the attack."""
    attacks = "; ".join(f"{a} ({', '.join(mechanisms_taking(a))})" for a in ATTACKS)
    return [
        plan_flag(
            "mechanism",
            str | None,
            "mechanism.name",
            "Mechanism audited: voting | esa | "
            "dps-mozo | a registered one (entry points of dpicl_audit.mechanisms).",
        ),
        plan_flag(
            "dataset",
            str | None,
            "dataset",
            "news-mini, bbc-news (docs/data.md), a JSONL/CSV path or hf:<name>.",
        ),
        plan_flag("canary", CanaryKind | None, "canary", "Canary kind."),
        plan_flag("setting", Setting | None, "setting", "Audit prompt or deployment's."),
        plan_flag(
            "threat_model",
            ThreatModel | None,
            "threat_model",
            "What the auditor sees.",
            shown_in=("run",),
        ),
        # The choices, with their mechanisms, are in the help; --adversary (later) wins.
        plan_flag("attack", Attack | None, "attack", attacks, metavar="<attack>"),
        own_flag(
            "adversary",
            str | None,
            "attack",
            "Paper 003 adversary (sets --attack): "
            "nat-advq | pois-advq | pois-natq-confident | pois-natq-unconfident | "
            "pois-natq-all-same | pois-natq-mapping. (default: none)",
            shown_in=("run",),
        ),
        plan_flag(
            "queries",
            int | None,
            "queries",
            "Paper 003: queries in the sequence.",
            shown_in=("run",),
        ),
        plan_flag(
            "design",
            VotingDesign | None,
            "design",
            "Inquery design of voting, ESA or a mechanism that declares them (auto: "
            "pivotal on a simulator, identical on a real engine).",
        ),
    ]


def privacy_flags() -> list[Flag]:
    """The mechanism's privacy parameters that every mechanism shares."""
    return [
        plan_flag(
            "epsilons",
            str | None,
            "mechanism.epsilons",
            "Comma-separated epsilons, e.g. 1,2,4,8.",
            parse=lambda v: parse_floats(v, "--epsilons"),
        ),
        plan_flag("delta", float | None, "mechanism.delta", "Per-query delta."),
        plan_flag("partitions", int | None, "mechanism.partitions", "Partitions T."),
        plan_flag("shots", int | None, "mechanism.shots", "Exemplars per partition."),
        plan_flag("temperature", float | None, "mechanism.temperature", "Vote temperature."),
        plan_flag("calibration", Calibration | None, "mechanism.calibration", "Noise calibration."),
    ]


def esa_flags() -> list[Flag]:
    """ESA's settings (generation: the signal pair and where its embeddings come from)."""
    return [
        plan_flag(
            "sensitivity",
            Literal["tight", "original"] | None,
            "mechanism.sensitivity",
            "ESA: Delta2 of the mean.",
        ),
        plan_flag("candidates", int | None, "mechanism.candidates", "ESA: zero-shot candidates."),
        plan_flag("max_tokens", int | None, "mechanism.max_tokens", "ESA, DPS-MOZO: tokens."),
        plan_flag(
            "signal",
            str | None,
            "generation.signal",
            "ESA: a Table 3 signal pair, e.g. clock-foxborough.",
        ),
        own_flag(
            "y1", str | None, "generation.y1", "ESA: own 'present' signal text. (default: none)"
        ),
        own_flag(
            "y0", str | None, "generation.y0", "ESA: own 'absent' signal text. (default: none)"
        ),
        plan_flag(
            "embeddings",
            EmbeddingSource | None,
            "generation.embeddings",
            "ESA: where e(y) comes from.",
        ),
        own_flag(
            "embedder",
            str | None,
            "generation.embedder",
            "ESA: local sentence-transformers model directory. (default: none)",
        ),
    ]


def mozo_flags() -> list[Flag]:
    """DPS-MOZO's settings."""
    return [
        plan_flag("exemplars", int | None, "mechanism.exemplars", "DPS-MOZO: |D|."),
        plan_flag("n_shots", int | None, "mechanism.n_shots", "DPS-MOZO: shots per token."),
        plan_flag("top_k", int | None, "mechanism.top_k", "DPS-MOZO: top-k."),
        plan_flag(
            "guarantee",
            Literal["proven", "paper"] | None,
            "mechanism.guarantee",
            "DPS-MOZO (paper: nominal).",
        ),
        plan_flag("alpha", int | None, "mechanism.alpha", "DPS-MOZO (paper mode): Renyi order."),
        plan_flag(
            "queries_per_context",
            int | None,
            "mechanism.queries_per_context",
            "DPS-MOZO: answers/context.",
        ),
        plan_flag(
            "signals",
            str | None,
            "mozo.signals",
            "DPS-MOZO: 'present,absent' first words.",
            parse=parse_strings,
        ),
    ]


def size_flags() -> list[Flag]:
    """The plan's sizes and statistics: trials, confidence, seeds, the neighbour."""
    return [
        plan_flag("trials", int | None, "trials", "Trials per epsilon.", shown_in=("run",)),
        Flag(
            "trials_from",
            str | None,
            typer.Option(
                "--trials-from",
                help="run: trials per epsilon from a bootstrap run in --db, the "
                "most its real_trials_for_power asks over these epsilons, so each has power. "
                "(default: none)",
            ),
            shown_in=("run",),
        ),
        plan_flag("confidence", float | None, "confidence", "e.g. 0.95"),
        shared_flag("split", SplitOpt, "split"),
        own_flag(
            "probes",
            str | None,
            "probes",
            f"Audits beside the trials ({', '.join(ALL_PROBES)}): comma-separated, or "
            "none. (default: all)",
            parse=parse_probes,
        ),
        plan_flag("seed", int | None, "seed", "Seed of the auditor's choices."),
        plan_flag("position", int | None, "neighbour.position", "Canary position in C1."),
        plan_flag(
            "partition_seed", int | None, "neighbour.partition_seed", "Shared partition seed."
        ),
        plan_flag(
            "n_llm",
            int | None,
            "bootstrap.n_llm",
            "Clean votes per world.",
            shown_in=("bootstrap",),
        ),
        plan_flag(
            "n_sample",
            int | None,
            "bootstrap.n_sample",
            "Simulated trials per world.",
            shown_in=("bootstrap",),
        ),
    ]


def deployment_flags() -> list[Flag]:
    """The deployment setting: a deployed context, its labels and template."""
    return [
        shared_flag("deployment", DeploymentOpt, "deployment.context"),
        own_flag(
            "deploy_labels",
            str | None,
            "deployment.labels",
            "Deployment labels, comma-separated. (default: none)",
            parse=parse_strings,
        ),
        own_flag(
            "deploy_template",
            str | None,
            "deployment.template",
            "Deployment template with {exemplars}, {query}. (default: none)",
        ),
        own_flag(
            "positive",
            str | None,
            "deployment.positive",
            "Deployment 'present' label. (default: none)",
        ),
        own_flag(
            "negative",
            str | None,
            "deployment.negative",
            "Deployment 'absent' label. (default: none)",
        ),
    ]


def request_flags() -> list[Flag]:
    """How the auditor talks to the server and writes its log."""
    return [
        plan_flag("concurrency", int | None, "concurrency", "Requests in flight."),
        plan_flag("timeout", float | None, "timeout", "Seconds per request."),
        plan_flag("retries", int | None, "retries", "Retries per request."),
        plan_flag("batch_size", int | None, "batch_size", "Trials per log write."),
    ]


def output_flags() -> list[Flag]:
    """The run's name and id, where it is logged and written, what is printed."""
    return [
        own_flag("name", str | None, "name", "A name for the run. (default: none)"),
        Flag("run_id", str | None, typer.Option(help="Run id (default: generated).")),
        shared_flag("profile", ProfileOpt, default="default"),
        shared_flag("db", DbOpt, default=DEFAULT_DB),
        shared_flag("out", OutOpt, default=Path("runs")),
        shared_flag("progress", ProgressOpt, default=True),
        shared_flag("as_json", JsonOpt, default=False),
        shared_flag("strict", StrictOpt, default=False),
    ]


#: ``--help``'s panels, in order, each with the function that lists its flags.
AUDIT_GROUPS: dict[str, Callable[[], list[Flag]]] = {
    "Plan and server": target_flags,
    "What is audited": audit_flags,
    "Privacy parameters": privacy_flags,
    "ESA": esa_flags,
    "DPS-MOZO": mozo_flags,
    "Trials and statistics": size_flags,
    "Deployment setting": deployment_flags,
    "Requests": request_flags,
    "Output": output_flags,
}


def _flags() -> list[Flag]:
    return [flag for group in AUDIT_GROUPS.values() for flag in group()]


def audit_parameters(kind: str) -> list[inspect.Parameter]:
    """The command's signature for typer: every flag in its panel, hidden where not ``kind``'s."""
    return [
        flag.parameter(kind, panel) for panel, group in AUDIT_GROUPS.items() for flag in group()
    ]


def plan_overrides(values: Mapping[str, object]) -> dict[str, object]:
    """The plan's dotted-path overrides from the parsed flags (``None``: keep the plan's).

    Two flags may set one path (``--attack``, then ``--adversary``): a later one given wins.
    """
    overrides: dict[str, object] = {}
    for flag in _flags():
        if flag.path is None:
            continue
        value = values[flag.name]
        if flag.parse is not None:
            value = flag.parse(value)
        if flag.path not in overrides or value:
            overrides[flag.path] = value
    return overrides
