"""dpicl-audit: black-box and white-box privacy auditing of DP-ICL endpoints over HTTP.

An independent implementation: it never imports the server package ``dpicl`` and talks to a
server only through HTTP API v1 (docs/architecture.md). The pieces, in the order data flows:

* :mod:`dpicl_audit.plan` an audit plan (TOML or CLI flags), validated on construction;
* :mod:`dpicl_audit.datasets` the bundled corpus and JSONL/CSV/Hugging Face loaders;
* :mod:`dpicl_audit.canaries` and :mod:`dpicl_audit.prompts` the replace-one neighbour
  contexts and the audit queries of paper 000 (Appendix B);
* :mod:`dpicl_audit.client` the async HTTP client;
* :mod:`dpicl_audit.store` the SQL trial log;
* :mod:`dpicl_audit.runner` real-query audits, bootstrap audits (Algorithm 1), resume;
* :mod:`dpicl_audit.estimators` and :mod:`dpicl_audit.bootstrap` the mathematics;
* :mod:`dpicl_audit.cli` the ``dpicl-audit`` command.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("dpicl-audit")
except metadata.PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.1.0"

__all__ = ["__version__"]
