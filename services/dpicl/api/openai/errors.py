"""OpenAI's error shape for the OpenAI-compatible routes (``/v1/models``,
``/v1/chat/completions``, ``/v1/completions``); every other route keeps dpicl's own shape.

OpenAI: ``{"error": {"message", "type", "param", "code"}}``. The same failures as on the
native routes, with OpenAI's statuses where its clients expect them:

* a bad value (native 422 ``invalid_request``) is a 400, as OpenAI answers it;
* an exhausted budget is the native 402 ``budget_exhausted`` (type ``insufficient_quota``),
  without ``Retry-After`` and with ``x-should-retry: false`` (api/errors.py adds them on both
  surfaces): neither the SDKs nor LiteLLM retry a 402, where they retry a 429 (a key's rate
  limit, 429 ``rate_limited``, keeps its ``Retry-After``: that one passes);
* an unknown context is a 404 with code ``model_not_found``.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

#: The paths served in OpenAI's shape (each with its sub-paths).
OPENAI_PATHS = ("/v1/models", "/v1/chat/completions", "/v1/completions")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    402: "insufficient_quota",
    429: "rate_limit_error",
    503: "server_error",
}

#: Native parameter names and their OpenAI counterparts.
_PARAMS = {"context_id": "model"}


def is_openai_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS)


def openai_status(status: int, code: str) -> int:
    """The status an OpenAI client gets for a native (status, code)."""
    if status == 422:
        return 400
    return status


def openai_error_response(
    status: int, code: str, message: str, param: str | None = None, headers: Any = None
) -> JSONResponse:
    """The native error (status, code, message, param) in OpenAI's shape and status."""
    status = openai_status(status, code)
    param = _PARAMS.get(param, param) if param is not None else None
    if status == 404 and code == "not_found" and param == "model":
        code = "model_not_found"
    out_headers = dict(headers or {})
    body = {
        "error": {
            "message": message,
            "type": _TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": param,
            "code": code,
        }
    }
    return JSONResponse(status_code=status, content=body, headers=out_headers or None)
