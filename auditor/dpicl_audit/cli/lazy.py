"""Commands imported when they run, not when ``dpicl-audit`` starts (issue 45).

``run`` and ``bootstrap`` build their options from the plan's defaults, and the plan imports
the estimators (scipy, dp_accounting): about two seconds before ``--help`` could print a
line. So :class:`LazyGroup` knows each command's name, its module and its one-line help
(:data:`COMMANDS`), lists them from that table, and imports a command's module (which
registers the command on the app) only when the command is resolved to run or to show its
own ``--help``. ``dpicl-audit --help`` imports none of them; a test checks that, and
another that each line here is the first paragraph of the command's own help.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
from typer._click import Command, Context  # typer 0.29 carries its own click
from typer.core import TyperCommand, TyperGroup

__all__ = ["COMMANDS", "LazyCommand", "LazyGroup"]


@dataclass(frozen=True)
class LazyCommand:
    """A command: the module that registers it, and the help shown in the command list."""

    module: str
    help: str


#: Name -> where it lives and its line in ``dpicl-audit --help``, in the order listed.
COMMANDS: dict[str, LazyCommand] = {
    "run": LazyCommand(
        "dpicl_audit.cli.audit",
        "Audit with real queries: C1/C0 contexts per epsilon, trials over HTTP, SQL log.",
    ),
    "bootstrap": LazyCommand(
        "dpicl_audit.cli.audit",
        "Audit with Algorithm 1: clean votes from /v1/debug/classify (white-box internal), "
        "then n_sample simulated trials per world, both threat models.",
    ),
    "resume": LazyCommand(
        "dpicl_audit.cli.log",
        "Continue a run from its trial log: only missing trials are run, none twice.",
    ),
    "list": LazyCommand(
        "dpicl_audit.cli.log",
        "The runs in the trial log: mechanism, kind, status and progress.",
    ),
    "show": LazyCommand(
        "dpicl_audit.cli.log",
        "A run's results (recomputed from the log when it has none stored yet).",
    ),
    "estimate": LazyCommand(
        "dpicl_audit.cli.log",
        "Lower bounds from attack counts obtained elsewhere, as JSON: mu_lower, epsilon_lower "
        "(Gaussian-DP) and epsilon_lower_classic (paper 003, Section 2.2).",
    ),
    "report": LazyCommand(
        "dpicl_audit.cli.log",
        "Write one report (table, HTML with plots) of the runs and print where it is.",
    ),
    "divergence": LazyCommand(
        "dpicl_audit.cli.rdp",
        "Exact D_alpha of noisy argmax between two histograms (the larger direction).",
    ),
    "utility": LazyCommand(
        "dpicl_audit.cli.utility",
        "Accuracy (or ROUGE-L) per epsilon and T with 95% intervals, beside the zero-shot and "
        "non-private baselines and the budget the ledger says the evaluation spent.",
    ),
}


class LazyGroup(TyperGroup):
    """The app's group: commands listed from :data:`COMMANDS`, imported when resolved."""

    _listing = False
    #: The app whose commands this group lists: set by :mod:`.common`, which builds it (so
    #: that this module does not import that one).
    typer_app: ClassVar[typer.Typer | None] = None

    def list_commands(self, ctx: Context) -> list[str]:
        names = list(COMMANDS)
        return names + [n for n in super().list_commands(ctx) if n not in COMMANDS]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        known = self.commands.get(cmd_name)
        if known is not None or cmd_name not in COMMANDS:
            return known
        entry = COMMANDS[cmd_name]
        if self._listing:  # the group's own --help: the line, not the module
            return TyperCommand(cmd_name, help=entry.help)
        return self._load(cmd_name, entry)

    def _load(self, name: str, entry: LazyCommand) -> Command | None:
        import typer.main

        app = self.typer_app
        assert app is not None, "LazyGroup.typer_app is set where the app is built"
        importlib.import_module(entry.module)  # registers its commands on the app
        for info in app.registered_commands:
            assert info.callback is not None
            if (info.name or typer.main.get_command_name(info.callback.__name__)) == name:
                command = typer.main.get_command_from_info(
                    info,
                    pretty_exceptions_short=app.pretty_exceptions_short,
                    rich_markup_mode=app.rich_markup_mode,
                )
                self.add_command(command, name)
                return command
        return None

    def format_help(self, ctx: Context, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False
