"""``dpicl-audit run`` and ``dpicl-audit bootstrap``: a plan from flags (and ``--plan``).

Every flag overrides the plan's value; ``--help`` shows the plan's default of each (a flag
left out keeps the TOML file's value, else that default).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from dpicl_audit.attacks import ATTACKS
from dpicl_audit.cli.common import (
    AdminOpt,
    DbOpt,
    JsonOpt,
    KeyOpt,
    OutOpt,
    ProgressOpt,
    UrlOpt,
    app,
    emit,
    err_console,
    exit_on_verdict,
    guard,
    load_results,
    require_log,
    run_async,
)
from dpicl_audit.mechanisms import MECHANISMS
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import DEFAULT_DB

__all__ = ["audit_command"]

_DEFAULTS = AuditPlan().model_dump(mode="json")
#: Defaults that depend on the mechanism (the plan fills them in).
_PER_MECHANISM = {
    "dataset": "news-mini (esa, dps-mozo: dialogsum-mini)",
    "mechanism.max_tokens": "64 (dps-mozo: 2)",
    "mechanism.n_shots": "|D| (mechanism.exemplars)",
    "mechanism.alpha": "the server's",
    "neighbour.position": "drawn from the seed",
    "neighbour.partition_seed": "drawn from the seed",
}


def _h(path: str, text: str) -> str:
    """Help text with the plan's default for the dotted ``path``."""
    if path in _PER_MECHANISM:
        return f"{text} (default: {_PER_MECHANISM[path]})"
    node: Any = _DEFAULTS
    for part in path.split("."):
        node = node[part]
    if isinstance(node, list):
        node = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in node)
    return f"{text} (default: {node})"


def _floats(text: str | None, name: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise typer.BadParameter(f"{name} must be comma-separated numbers, got {text!r}") from exc


def _strings(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [x.strip() for x in text.split(",") if x.strip()]


def audit_command(kind: str) -> Callable[..., None]:
    def command(
        plan: Annotated[
            Path | None,
            typer.Option("--plan", help="TOML plan; flags override it. (default: none)"),
        ] = None,
        url: UrlOpt = None,
        admin_token: AdminOpt = None,
        api_key: KeyOpt = None,
        dataset: Annotated[
            str | None,
            typer.Option(
                help=_h("dataset", "Bundled name (news-mini), JSONL/CSV path, hf:<name>.")
            ),
        ] = None,
        canary: Annotated[
            str | None, typer.Option(help=_h("canary", "natural | mislabeled | random"))
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
            str | None, typer.Option(help=_h("mechanism.calibration", "classic | analytic"))
        ] = None,
        setting: Annotated[
            str | None, typer.Option(help=_h("setting", "audit-template | deployment"))
        ] = None,
        threat_model: Annotated[
            str | None, typer.Option(help=_h("threat_model", "black-box | white-box"))
        ] = None,
        attack: Annotated[
            str | None,
            typer.Option(
                help=_h(
                    "attack",
                    "; ".join(f"{a.name} ({', '.join(a.mechanisms)})" for a in ATTACKS.values()),
                )
            ),
        ] = None,
        design: Annotated[
            str | None,
            typer.Option(
                help=_h(
                    "design",
                    "voting or ESA inquery design: auto | paper | pivotal | identical (auto: "
                    "pivotal on a simulator, identical on a real engine)",
                )
            ),
        ] = None,
        mechanism: Annotated[
            str | None, typer.Option(help=_h("mechanism.name", " | ".join(MECHANISMS)))
        ] = None,
        adversary: Annotated[
            str | None,
            typer.Option(
                help="Paper 003 adversary (sets --attack): nat-advq | pois-advq | "
                "pois-natq-{confident,unconfident,all-same,mapping}. (default: none)"
            ),
        ] = None,
        queries: Annotated[
            int | None, typer.Option(help=_h("queries", "Paper 003: queries in the sequence."))
        ] = None,
        sensitivity: Annotated[
            str | None, typer.Option(help=_h("mechanism.sensitivity", "ESA: tight | original"))
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
            str | None,
            typer.Option(help=_h("mechanism.guarantee", "DPS-MOZO: proven | paper (nominal).")),
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
            str | None,
            typer.Option(
                help=_h(
                    "generation.embeddings", "ESA: where e(y) comes from: auto | server | local"
                )
            ),
        ] = None,
        embedder: Annotated[
            str | None,
            typer.Option(help="ESA: local sentence-transformers model directory. (default: none)"),
        ] = None,
        trials: Annotated[
            int | None, typer.Option(help=_h("trials", "Trials per epsilon."))
        ] = None,
        trials_from: Annotated[
            str | None,
            typer.Option(
                "--trials-from",
                help="run: trials per epsilon from a bootstrap run in --db, the most its "
                "real_trials_for_power asks over these epsilons, so each has power. "
                "(default: none)",
            ),
        ] = None,
        confidence: Annotated[
            float | None, typer.Option(help=_h("confidence", "e.g. 0.95"))
        ] = None,
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
            typer.Option(help=_h("bootstrap.n_llm", "Bootstrap: clean votes per world.")),
        ] = None,
        n_sample: Annotated[
            int | None,
            typer.Option(help=_h("bootstrap.n_sample", "Bootstrap: simulated trials per world.")),
        ] = None,
        name: Annotated[
            str | None, typer.Option(help="A name for the run. (default: none)")
        ] = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
        profile: Annotated[
            str,
            typer.Option(
                "--profile",
                show_default=True,
                help="default: the plan as given. "
                "verify (run, voting): also a tail-gap run (paper design, T=3, epsilon 8, "
                "3,000 trials) that sees noise with bounded tails (docs/auditing.md).",
            ),
        ] = "default",
        db: DbOpt = DEFAULT_DB,
        out: OutOpt = Path("runs"),
        progress: ProgressOpt = True,
        as_json: JsonOpt = False,
    ) -> None:
        from dpicl_audit.profiles import companion_plan
        from dpicl_audit.runner import bootstrap_audit, run_audit

        overrides: dict[str, Any] = {
            "name": name,
            "target.base_url": url,
            "target.admin_token": admin_token,
            "target.api_key": api_key,
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
            "seed": seed,
            "concurrency": concurrency,
            "timeout": timeout,
            "retries": retries,
            "batch_size": batch_size,
            "neighbour.position": position,
            "neighbour.partition_seed": partition_seed,
            "deployment.labels": _strings(deploy_labels),
            "deployment.template": deploy_template,
            "deployment.positive": positive,
            "deployment.negative": negative,
            "bootstrap.n_llm": n_llm,
            "bootstrap.n_sample": n_sample,
        }
        audit_plan = guard(lambda: AuditPlan.from_sources(plan, overrides))
        if trials_from is not None:
            overrides["trials"] = _trials_from(kind, trials_from, trials, db, audit_plan)
            audit_plan = guard(lambda: AuditPlan.from_sources(plan, overrides))
        fn = bootstrap_audit if kind == "bootstrap" else run_audit
        results = run_async(
            fn(
                audit_plan,
                db=db,
                run_id=run_id,
                out_dir=out,
                progress=progress,
                console=err_console,
            )
        )
        runs = [results]
        companion = guard(lambda: companion_plan(profile, kind, audit_plan))
        if companion is not None:  # --profile verify: the tail-gap run (profiles.py)
            tail_id = f"{results['run_id']}-tail"
            runs.append(run_async(run_audit(companion, db=db, run_id=tail_id, out_dir=out,
                                            progress=progress, console=err_console)))  # fmt: skip
            if as_json:  # one JSON document: the companion inside the main run's
                results = results | {"verify": {"tail_gap": runs[1]}}
        for res in runs[: 1 if as_json else 2]:
            emit(res, as_json, Path(out) / str(res["run_id"]) / "results.json")
        exit_on_verdict(runs)

    command.__doc__ = (
        "Audit with real queries: C1/C0 contexts per epsilon, trials over HTTP, SQL log."
        if kind == "run"
        else "Audit with Algorithm 1: clean votes from /v1/debug/classify (white-box "
        "internal), then n_sample simulated trials per world, both threat models."
    )
    return command


def _trials_from(kind: str, boot: str, trials: int | None, db: str, plan: AuditPlan) -> int:
    """``--trials-from``: a run's trials per epsilon from a bootstrap's planning figure."""
    from dpicl_audit.trial_budget import trials_from_bootstrap

    if kind != "run" or trials is not None:
        what = "only for run" if kind != "run" else "give it or --trials, not both"
        err_console.print(f"[bold red]error:[/bold red] --trials-from: {what}")
        raise typer.Exit(2)
    require_log(db, boot)
    results = guard(lambda: load_results(db, boot))
    n = guard(
        lambda: trials_from_bootstrap(
            results,
            mechanism=plan.mechanism.name,
            epsilons=plan.mechanism.epsilons,
            confidence=plan.confidence,
            split=plan.split,
        )
    )
    err_console.print(f"{n:,} trials per epsilon: what the bootstrap {boot!r} needs for power")
    return n


app.command("run")(audit_command("run"))
app.command("bootstrap")(audit_command("bootstrap"))
