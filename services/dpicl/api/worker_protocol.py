"""The head-limited HTTP protocol of one worker process (``DPICL_WORKERS``, api/workers.py).

uvicorn gives a worker process its protocol class by name, so the class cannot carry limits
set in the supervising process; importing this module builds it from the worker's own
``DPICL_*`` settings, the same values as the supervisor's (one environment).
"""

from __future__ import annotations

from dpicl.api.http_limits import HttpLimits, LimitedHttpToolsProtocol, protocol_class
from dpicl.config import Settings

WorkerHttpProtocol: type[LimitedHttpToolsProtocol] = protocol_class(
    HttpLimits.from_settings(Settings())
)
