"""The auditor's exception tree.

Every error the auditor raises on purpose derives from :class:`AuditError`, so a caller (the
CLI, a notebook) can catch the auditor's own failures in one place and let programming errors
through. Errors about bad input values also derive from :class:`ValueError`, so code that
already guards against ``ValueError`` keeps working::

    Exception
    └── AuditError                      anything the auditor raises on purpose
        ├── InvalidAuditInput           a bad input value (also a ValueError): negative
        │   │                           counts, a confidence outside (0, 1), a delta outside
        │   │                           (0, 1), arrays of the wrong shape, ...
        │   ├── InvalidPlan             an audit plan (TOML file or flags) that fails
        │   │                           validation; the message names every bad field
        │   └── DatasetError            a dataset that cannot be found, read or used
        ├── TargetError                 the server under audit could not be used
        │   ├── TargetRejected          the server answered 4xx; carries its error
        │   │   │                       ``status``, ``code``, ``message`` and ``param``
        │   │   ├── TargetUnauthorized  401: a missing or wrong token
        │   │   ├── TargetNotFound      404: an unknown context, or /v1/debug/* while the
        │   │   │                       server's white-box access is off
        │   │   └── TargetBudgetExhausted  402 (older servers: 403, 429): the
        │   │                           context's budget is spent
        │   ├── TargetUnavailable       no answer after every retry (connection errors,
        │   │                           timeouts, 5xx); carries the last ``status``
        │   └── TargetProtocolError     an answer that does not follow HTTP API v1, or a
        │                               context that does not match the audit's settings
        └── RunNotFound                 no run with that id in the trial log

Extend the tree here (and redraw it here and in the package docstring, where a test checks
it) rather than raising bare built-in exceptions.
"""

from __future__ import annotations

__all__ = [
    "AuditError",
    "DatasetError",
    "InvalidAuditInput",
    "InvalidPlan",
    "RunNotFound",
    "TargetBudgetExhausted",
    "TargetError",
    "TargetNotFound",
    "TargetProtocolError",
    "TargetRejected",
    "TargetUnauthorized",
    "TargetUnavailable",
]


class AuditError(Exception):
    """Base class of every error the auditor raises on purpose."""


class InvalidAuditInput(AuditError, ValueError):
    """An input value the auditor cannot work with; the message names the bad value."""


class InvalidPlan(InvalidAuditInput):
    """An audit plan that fails validation; the message names every bad field."""


class DatasetError(InvalidAuditInput):
    """A dataset that cannot be found, read, or used for the audit (too few examples, ...)."""


class TargetError(AuditError):
    """The server under audit could not be used."""


class TargetRejected(TargetError):
    """The server answered with a 4xx error in the API's error shape.

    ``code``, ``message`` and ``param`` are the server's own (``{"error": {...}}``); ``status``
    is the HTTP status. 4xx answers are never retried.
    """

    def __init__(
        self, status: int, code: str, message: str, param: str | None = None, *, path: str = ""
    ) -> None:
        where = f" at {path}" if path else ""
        detail = f" (param {param})" if param else ""
        super().__init__(f"server rejected the request{where}: {status} {code}: {message}{detail}")
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.path = path


class TargetUnauthorized(TargetRejected):
    """401: a missing or wrong admin token or API key."""


class TargetNotFound(TargetRejected):
    """404: an unknown context, or a /v1/debug/* path on a server with white-box access off."""


class TargetBudgetExhausted(TargetRejected):
    """402 ``budget_exhausted`` (403 natively and 429 on the OpenAI surface from servers
    before issue 39): the context's privacy budget is spent (nothing was charged)."""


class TargetUnavailable(TargetError):
    """No usable answer after every retry: connection errors, timeouts or 5xx answers."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class TargetProtocolError(TargetError):
    """An answer that does not follow HTTP API v1 (not JSON, missing fields, ...)."""


class RunNotFound(AuditError):
    """No run with the given id in the trial log."""
