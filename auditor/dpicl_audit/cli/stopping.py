"""How a command's run lives and stops: its coroutine run to the end, Ctrl-C and SIGTERM
turned into one line and an exit status (130, 143) with the trials kept, and the command
line that resumes it."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any, TypeVar

import typer

from dpicl_audit.cli.common import ADMIN_TOKEN_VAR, err_console
from dpicl_audit.errors import AuditError, RunNotFound
from dpicl_audit.store import TrialStore
from dpicl_audit.store.db import DEFAULT_DB, sqlite_file_missing

__all__ = ["ResumeHint", "db_option", "once_logged", "resume_command", "run_async"]

T = TypeVar("T")


def db_option(db: str) -> str:
    """`` --db DB`` (quoted for a shell) where ``db`` is not the default log, else ``""``."""
    return "" if db == DEFAULT_DB else f" --db {shlex.quote(db)}"


def resume_command(run_id: str, db: str) -> str:
    """The command line that continues ``run_id`` (``--db`` only when not the default), and
    the admin token it needs: tokens are never logged, so a run started with
    ``--admin-token`` must be given it again, and the hint names the variable to set
    (never the token)."""
    command = f"dpicl-audit resume {shlex.quote(run_id)}{db_option(db)}"
    if os.environ.get(ADMIN_TOKEN_VAR):
        return f"{command} (it reads the admin token from {ADMIN_TOKEN_VAR}, set here)"
    return (
        f"{command} after export {ADMIN_TOKEN_VAR}=... (the server's admin token; "
        "tokens are not stored in the log)"
    )


#: How to continue a command's run: the command line, or a function of the moment that gives
#: it (:func:`once_logged`), or None where there is none.
ResumeHint = str | Callable[[], str | None] | None


def once_logged(db: str, run_id: str, hint: str) -> Callable[[], str | None]:
    """``hint`` where the trial log at ``db`` has the run ``run_id``, else None: a Ctrl-C
    before the run began (its server's health read, its design built, a dataset downloaded)
    left nothing to resume. Where the log cannot be read, ``hint``."""

    def hint_now() -> str | None:
        try:
            if sqlite_file_missing(db) is not None:
                return None
            store = TrialStore(db)
            try:
                store.get_run(run_id)
            finally:
                store.dispose()
        except RunNotFound:
            return None
        except Exception:  # an unreadable log: the hint, as the one way on
            return hint
        return hint

    return hint_now


def run_async(coro: Coroutine[Any, Any, T], resume_hint: ResumeHint = None) -> T:
    """Run the command's coroutine. Ctrl-C ends it with one line (how to resume, when there
    is something to resume) and exit status 130, not a traceback; SIGTERM (a CI job's timeout,
    ``docker stop``, ``kill``) stops it the same way, the trials done kept, with exit 143."""
    terminated = False

    async def main() -> T:
        # asyncio turns only SIGINT into a clean cancellation of the command; SIGTERM's
        # default would kill the process with the batch of trials in flight unlogged and the
        # run left "running".
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        with suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        return await coro

    try:
        return asyncio.run(main())
    except AuditError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        err_console.print(_interrupted(resume_hint), soft_wrap=True, highlight=False)
        raise typer.Exit(130) from None
    except asyncio.CancelledError:
        if not terminated:
            raise
        line = _interrupted(resume_hint).replace("interrupted", "terminated", 1)
        err_console.print(line, soft_wrap=True, highlight=False)
        raise typer.Exit(128 + signal.SIGTERM) from None


def _interrupted(resume_hint: ResumeHint) -> str:
    """The one line a Ctrl-C prints."""
    if callable(resume_hint):
        resume_hint = resume_hint()
        if resume_hint is None:
            return "interrupted before the run began: nothing was logged, nothing to resume"
    line = "interrupted; the trials done so far are in the log"
    if resume_hint:
        line += f"; resume with: {resume_hint}"
    return line
