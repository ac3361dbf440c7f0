"""The server's exception tree. Every error a client can see maps to one HTTP status and
one stable ``code`` in the single error shape ``{"error": {"code", "message", "param"}}``.

::

    DpiclError                      500 internal_error
    ├── InvalidRequest              422 invalid_request   (names the bad value in ``param``)
    │   ├── ConfigurationError      422 invalid_request   (mechanism or budget settings)
    │   └── UnsupportedParameter    400 unsupported_parameter (OpenAI surface: a parameter
    │                                   that would leak or cannot be honoured)
    ├── Unauthorized                401 unauthorized
    ├── NotFound                    404 not_found
    │   └── ModelNotFound           404 model_not_found   (OpenAI surface: no such context)
    ├── BudgetExhausted             402 budget_exhausted  (nothing was charged; on both
    │                                   surfaces, no Retry-After, x-should-retry: false)
    ├── PayloadTooLarge             413 payload_too_large
    ├── RequestTimeout              408 request_timeout   (the head or body came too slowly)
    ├── UriTooLong                  414 uri_too_long
    ├── HeadersTooLarge             431 headers_too_large
    ├── RateLimited                 429 rate_limited      (a key's rate limit; Retry-After)
    ├── EngineError                 503 engine_unavailable (nothing was charged; Retry-After:
    │                                   the engine's restart backoff)
    ├── StorageUnavailable          503 storage_unavailable (the database failed or timed
    │                                   out; nothing was charged; Retry-After: the storage
    │                                   deadline, DPICL_DB_TIMEOUT_S)
    └── ServerBusy                  503 server_busy       (DPICL_MAX_CONNECTIONS reached)

Messages name the value that is wrong; ``param`` is its dotted path in the request body.
An error that waiting can cure carries ``retry_after_s`` (``Retry-After``); where the raiser
does not know it, the API fills it in (:mod:`dpicl.api.errors`).
"""

from __future__ import annotations


class DpiclError(Exception):
    """Base of every error the server raises on purpose."""

    status_code: int = 500
    code: str = "internal_error"

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        #: Seconds after which a retry may succeed (``Retry-After``); None: not said here.
        self.retry_after_s = retry_after_s


class InvalidRequest(DpiclError):
    status_code = 422
    code = "invalid_request"


class ConfigurationError(InvalidRequest):
    """Mechanism or budget settings that cannot be honoured (epsilon <= 0, T > |D|, ...)."""


class UnsupportedParameter(InvalidRequest):
    """An OpenAI parameter the server refuses: it would release un-noised internals
    (``logprobs``), or the mechanism cannot honour it (``n > 1``, ``tools``, ``seed``)."""

    status_code = 400
    code = "unsupported_parameter"


class Unauthorized(DpiclError):
    status_code = 401
    code = "unauthorized"


class NotFound(DpiclError):
    status_code = 404
    code = "not_found"


class ModelNotFound(NotFound):
    """The OpenAI surface's name for an unknown context (a context is a model there)."""

    code = "model_not_found"


class BudgetExhausted(DpiclError):
    """The context's (or the key's) privacy budget cannot afford the answer. 402, not 403 or
    429: LiteLLM's router retries a 403 and a 429 and the OpenAI SDKs retry a 429, while no
    waiting refills a privacy budget; the SDKs and LiteLLM pass a 402 on at once (README,
    "Behind a gateway")."""

    status_code = 402
    code = "budget_exhausted"


class PayloadTooLarge(DpiclError):
    status_code = 413
    code = "payload_too_large"


class RequestTimeout(DpiclError):
    """The request's head or body did not arrive within its timeout (a slow or stalled client)."""

    status_code = 408
    code = "request_timeout"


class UriTooLong(DpiclError):
    status_code = 414
    code = "uri_too_long"


class HeadersTooLarge(DpiclError):
    status_code = 431
    code = "headers_too_large"


class EngineError(DpiclError):
    status_code = 503
    code = "engine_unavailable"


class StorageUnavailable(DpiclError):
    status_code = 503
    code = "storage_unavailable"


class ServerBusy(DpiclError):
    status_code = 503
    code = "server_busy"


class RateLimited(DpiclError):
    """A key's requests per minute are used up; ``retry_after_s`` goes to ``Retry-After``."""

    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int, param: str | None = None) -> None:
        super().__init__(message, param=param, retry_after_s=retry_after_s)
