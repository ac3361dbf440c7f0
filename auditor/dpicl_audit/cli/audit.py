"""``dpicl-audit run`` and ``dpicl-audit bootstrap``: a plan from flags (and ``--plan``).

Every flag overrides the plan's value; ``--help`` shows the plan's default of each (a flag
left out keeps the TOML file's value, else that default).
"""

# No `from __future__ import annotations`: the options' annotations are evaluated where the
# command is built, so that each command hides the options that are not its own (`kind`).
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from dpicl_audit.attacks import ATTACKS
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
    app,
    emit,
    err_console,
    exit_on_verdict,
    guard,
    resume_command,
    run_async,
    trials_from_option,
)
from dpicl_audit.cli.flags import help_text as _h
from dpicl_audit.cli.flags import parse_floats as _floats
from dpicl_audit.cli.flags import parse_strings as _strings
from dpicl_audit.plan import (
    Attack,
    AuditPlan,
    Calibration,
    CanaryKind,
    EmbeddingSource,
    Setting,
    ThreatModel,
    VotingDesign,
)
from dpicl_audit.store.db import DEFAULT_DB

# The mechanisms' modules (DPS-MOZO's, ESA's, dp-accounting under them) are imported by the
# runner when a command runs, not here: `--help` reads only the plan's types and defaults.

__all__ = ["audit_command"]


def audit_command(kind: str) -> Callable[..., None]:
    def command(
        plan: Annotated[
            Path | None,
            typer.Option("--plan", help="TOML plan; flags override it. (default: none)"),
        ] = None,
        url: UrlOpt = None,
        admin_token: AdminOpt = None,
        api_key: KeyOpt = None,
        api: Annotated[
            str | None,
            typer.Option(
                help=_h(
                    "target.api",
                    "native: /v1/classify, /v1/generate | openai: chat completions, the "
                    "answer read from choices (black-box only)",
                )
            ),
        ] = None,
        context_hook: Annotated[
            str | None,
            typer.Option(
                help="With --api openai: a Python entry point module:function or a command "
                "that receives each context (JSON) and returns the model id to query, "
                "instead of POST /v1/contexts. (default: none)"
            ),
        ] = None,
        dataset: Annotated[
            str | None,
            typer.Option(
                help=_h(
                    "dataset", "news-mini, bbc-news (docs/data.md), a JSONL/CSV path or hf:<name>."
                )
            ),
        ] = None,
        canary: Annotated[
            CanaryKind | None, typer.Option(help=_h("canary", "Canary kind."))
        ] = None,
        epsilons: Annotated[
            str | None,
            typer.Option(help=_h("mechanism.epsilons", "Comma-separated epsilons, e.g. 1,2,4,8.")),
        ] = None,
        delta: Annotated[
            float | None, typer.Option(help=_h("mechanism.delta", "Per-query delta."))
        ] = None,
        partitions: Annotated[
            int | None, typer.Option(help=_h("mechanism.partitions", "Partitions T."))
        ] = None,
        shots: Annotated[
            int | None, typer.Option(help=_h("mechanism.shots", "Exemplars per partition."))
        ] = None,
        temperature: Annotated[
            float | None, typer.Option(help=_h("mechanism.temperature", "Vote temperature."))
        ] = None,
        calibration: Annotated[
            Calibration | None, typer.Option(help=_h("mechanism.calibration", "Noise calibration."))
        ] = None,
        setting: Annotated[
            Setting | None, typer.Option(help=_h("setting", "Audit prompt or deployment's."))
        ] = None,
        threat_model: Annotated[
            ThreatModel | None,
            typer.Option(
                help=_h("threat_model", "What the auditor sees."), hidden=kind == "bootstrap"
            ),
        ] = None,
        attack: Annotated[
            Attack | None,
            typer.Option(
                metavar="<attack>",  # the choices, with their mechanisms, are in the help
                help=_h(
                    "attack",
                    "; ".join(f"{a.name} ({', '.join(a.mechanisms)})" for a in ATTACKS.values()),
                ),
            ),
        ] = None,
        design: Annotated[
            VotingDesign | None,
            typer.Option(
                help=_h(
                    "design",
                    "Voting or ESA inquery design (auto: pivotal on a simulator, identical on "
                    "a real engine).",
                )
            ),
        ] = None,
        mechanism: Annotated[
            str | None,
            typer.Option(
                help=_h(
                    "mechanism.name",
                    "Mechanism audited: voting | esa | dps-mozo | a "
                    "registered one (entry points of dpicl_audit.mechanisms).",
                )
            ),
        ] = None,
        adversary: Annotated[
            str | None,
            typer.Option(
                hidden=kind == "bootstrap",
                help="Paper 003 adversary (sets --attack): nat-advq | pois-advq | "
                "pois-natq-{confident,unconfident,all-same,mapping}. (default: none)",
            ),
        ] = None,
        queries: Annotated[
            int | None,
            typer.Option(
                help=_h("queries", "Paper 003: queries in the sequence."),
                hidden=kind == "bootstrap",
            ),
        ] = None,
        sensitivity: Annotated[
            Literal["tight", "original"] | None,
            typer.Option(help=_h("mechanism.sensitivity", "ESA: Delta2 of the mean.")),
        ] = None,
        candidates: Annotated[
            int | None, typer.Option(help=_h("mechanism.candidates", "ESA: zero-shot candidates."))
        ] = None,
        max_tokens: Annotated[
            int | None, typer.Option(help=_h("mechanism.max_tokens", "ESA, DPS-MOZO: tokens."))
        ] = None,
        exemplars: Annotated[
            int | None, typer.Option(help=_h("mechanism.exemplars", "DPS-MOZO: |D|."))
        ] = None,
        n_shots: Annotated[
            int | None, typer.Option(help=_h("mechanism.n_shots", "DPS-MOZO: shots per token."))
        ] = None,
        top_k: Annotated[
            int | None, typer.Option(help=_h("mechanism.top_k", "DPS-MOZO: top-k."))
        ] = None,
        guarantee: Annotated[
            Literal["proven", "paper"] | None,
            typer.Option(help=_h("mechanism.guarantee", "DPS-MOZO (paper: nominal).")),
        ] = None,
        alpha: Annotated[
            int | None,
            typer.Option(help=_h("mechanism.alpha", "DPS-MOZO (paper mode): Renyi order.")),
        ] = None,
        queries_per_context: Annotated[
            int | None,
            typer.Option(help=_h("mechanism.queries_per_context", "DPS-MOZO: answers/context.")),
        ] = None,
        signals: Annotated[
            str | None,
            typer.Option(help=_h("mozo.signals", "DPS-MOZO: 'present,absent' first words.")),
        ] = None,
        signal: Annotated[
            str | None,
            typer.Option(
                help=_h("generation.signal", "ESA: a Table 3 signal pair, e.g. clock-foxborough.")
            ),
        ] = None,
        y1: Annotated[
            str | None, typer.Option(help="ESA: own 'present' signal text. (default: none)")
        ] = None,
        y0: Annotated[
            str | None, typer.Option(help="ESA: own 'absent' signal text. (default: none)")
        ] = None,
        embeddings: Annotated[
            EmbeddingSource | None,
            typer.Option(help=_h("generation.embeddings", "ESA: where e(y) comes from.")),
        ] = None,
        embedder: Annotated[
            str | None,
            typer.Option(help="ESA: local sentence-transformers model directory. (default: none)"),
        ] = None,
        trials: Annotated[
            int | None,
            typer.Option(help=_h("trials", "Trials per epsilon."), hidden=kind == "bootstrap"),
        ] = None,
        trials_from: Annotated[
            str | None,
            typer.Option(
                "--trials-from",
                hidden=kind != "run",
                help="run: trials per epsilon from a bootstrap run in --db, the most its "
                "real_trials_for_power asks over these epsilons, so each has power. "
                "(default: none)",
            ),
        ] = None,
        confidence: Annotated[
            float | None, typer.Option(help=_h("confidence", "e.g. 0.95"))
        ] = None,
        split: SplitOpt = None,
        seed: Annotated[
            int | None, typer.Option(help=_h("seed", "Seed of the auditor's choices."))
        ] = None,
        concurrency: Annotated[
            int | None, typer.Option(help=_h("concurrency", "Requests in flight."))
        ] = None,
        timeout: Annotated[
            float | None, typer.Option(help=_h("timeout", "Seconds per request."))
        ] = None,
        retries: Annotated[
            int | None, typer.Option(help=_h("retries", "Retries per request."))
        ] = None,
        batch_size: Annotated[
            int | None, typer.Option(help=_h("batch_size", "Trials per log write."))
        ] = None,
        position: Annotated[
            int | None, typer.Option(help=_h("neighbour.position", "Canary position in C1."))
        ] = None,
        partition_seed: Annotated[
            int | None, typer.Option(help=_h("neighbour.partition_seed", "Shared partition seed."))
        ] = None,
        deployment: DeploymentOpt = None,
        deploy_labels: Annotated[
            str | None, typer.Option(help="Deployment labels, comma-separated. (default: none)")
        ] = None,
        deploy_template: Annotated[
            str | None,
            typer.Option(help="Deployment template with {exemplars}, {query}. (default: none)"),
        ] = None,
        positive: Annotated[
            str | None, typer.Option(help="Deployment 'present' label. (default: none)")
        ] = None,
        negative: Annotated[
            str | None, typer.Option(help="Deployment 'absent' label. (default: none)")
        ] = None,
        n_llm: Annotated[
            int | None,
            typer.Option(
                help=_h("bootstrap.n_llm", "Clean votes per world."), hidden=kind != "bootstrap"
            ),
        ] = None,
        n_sample: Annotated[
            int | None,
            typer.Option(
                help=_h("bootstrap.n_sample", "Simulated trials per world."),
                hidden=kind != "bootstrap",
            ),
        ] = None,
        name: Annotated[
            str | None, typer.Option(help="A name for the run. (default: none)")
        ] = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
        profile: ProfileOpt = "default",
        db: DbOpt = DEFAULT_DB,
        out: OutOpt = Path("runs"),
        progress: ProgressOpt = True,
        as_json: JsonOpt = False,
        strict: StrictOpt = False,
    ) -> None:
        from dpicl_audit.pipeline.profiles import companion_plan, tail_run_id
        from dpicl_audit.pipeline.results import record_tail_gap
        from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
        from dpicl_audit.planning.schedule import new_run_id

        overrides: dict[str, Any] = {
            "name": name,
            "target.base_url": url,
            "target.admin_token": admin_token,
            "target.api_key": api_key,
            "target.api": api,
            "target.context_hook": context_hook,
            "dataset": dataset,
            "canary": canary,
            "mechanism.epsilons": _floats(epsilons, "--epsilons"),
            "mechanism.delta": delta,
            "mechanism.partitions": partitions,
            "mechanism.shots": shots,
            "mechanism.temperature": temperature,
            "mechanism.calibration": calibration,
            "mechanism.name": mechanism,
            "mechanism.sensitivity": sensitivity,
            "mechanism.candidates": candidates,
            "mechanism.max_tokens": max_tokens,
            "mechanism.exemplars": exemplars,
            "mechanism.n_shots": n_shots,
            "mechanism.top_k": top_k,
            "mechanism.guarantee": guarantee,
            "mechanism.alpha": alpha,
            "mechanism.queries_per_context": queries_per_context,
            "mozo.signals": _strings(signals),
            "generation.signal": signal,
            "generation.y1": y1,
            "generation.y0": y0,
            "generation.embeddings": embeddings,
            "generation.embedder": embedder,
            "setting": setting,
            "threat_model": threat_model,
            "attack": adversary or attack,
            "queries": queries,
            "design": design,
            "trials": trials,
            "confidence": confidence,
            "split": split,
            "seed": seed,
            "concurrency": concurrency,
            "timeout": timeout,
            "retries": retries,
            "batch_size": batch_size,
            "neighbour.position": position,
            "neighbour.partition_seed": partition_seed,
            "deployment.context": deployment,
            "deployment.labels": _strings(deploy_labels),
            "deployment.template": deploy_template,
            "deployment.positive": positive,
            "deployment.negative": negative,
            "bootstrap.n_llm": n_llm,
            "bootstrap.n_sample": n_sample,
        }
        audit_plan = guard(lambda: AuditPlan.from_sources(plan, overrides))
        if trials_from is not None:
            overrides["trials"] = trials_from_option(kind, trials_from, trials, db, audit_plan)
            audit_plan = guard(lambda: AuditPlan.from_sources(plan, overrides))
        fn = bootstrap_audit if kind == "bootstrap" else run_audit
        # The id is fixed here, not by the runner, so that Ctrl-C can say what to resume.
        rid = run_id or new_run_id()
        results = run_async(
            fn(
                audit_plan,
                db=db,
                run_id=rid,
                out_dir=out,
                progress=progress,
                console=err_console,
            ),
            resume_hint=resume_command(rid, db),
        )
        runs = [results]
        companion = guard(lambda: companion_plan(profile, kind, audit_plan))
        if companion is not None:  # --profile verify: the tail-gap run (profiles.py)
            tail_id = tail_run_id(str(results["run_id"]))
            tail = run_async(run_audit(companion, db=db, run_id=tail_id, out_dir=out,
                                       progress=progress, console=err_console))  # fmt: skip
            # One JSON document, stored with the run: the companion inside the run's.
            runs = [guard(lambda: record_tail_gap(db, results, tail, out)), tail]
        for res in runs[: 1 if as_json else 2]:
            emit(res, as_json, Path(out) / str(res["run_id"]) / "results.json")
        exit_on_verdict(runs, strict)

    command.__doc__ = (
        "Audit with real queries: C1/C0 contexts per epsilon, trials over HTTP, SQL log."
        if kind == "run"
        else "Audit with Algorithm 1: clean votes from /v1/debug/classify (white-box "
        "internal), then n_sample simulated trials per world, both threat models."
    )
    return command


app.command("run")(audit_command("run"))
app.command("bootstrap")(audit_command("bootstrap"))
