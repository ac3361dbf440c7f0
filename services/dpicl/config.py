"""Server settings: one pydantic-settings class, every field overridable as ``DPICL_<FIELD>``
(or from a ``.env`` file). Secure by default: white-box off, admin token required (one is
generated and printed at start when none is configured).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dpicl.domain import MAX_SYNTHESIZE_INPUTS

EngineName = Literal["transformers", "oracle", "vllm"]
WhiteBox = Literal["off", "noisy", "internal"]
DTypeName = Literal["auto", "bfloat16", "float16", "float32"]
LoadFormat = Literal["auto", "dummy"]


class Settings(BaseSettings):
    """Everything the server reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix="DPICL_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    host: str = "127.0.0.1"
    # 0: any free port. (uvicorn took 99999 modulo 65536 and served on port 34463.)
    port: int = Field(default=8000, ge=0, le=65_535)
    # Not in the settings' repr: a PostgreSQL URL may hold a password. (A str, not a
    # SecretStr, so every reader keeps working; the CLI never echoes it either.)
    database_url: str = Field(default="sqlite:///./dpicl.db", repr=False)
    engine: EngineName = "transformers"
    model: str | None = Field(
        default=None, description="Model directory or hub name; None is the bundled SmolLM2."
    )
    embedder: str | None = Field(
        default=None, description="sentence-transformers directory; None is bundled MiniLM."
    )
    # torch device of the transformers engine and the embedder (engines/placement.py): auto
    # is the CUDA GPU where torch sees one, the CPU otherwise (logged at start, and /readyz
    # shows the device chosen beside this setting); or cpu, cuda, cuda:1, ...
    device: str = "auto"
    # The weights' dtype (engines/placement.py): auto is bfloat16 on a CUDA device that has
    # it, float16 on one that has not, float32 on the CPU. Loaded straight onto the device.
    dtype: DTypeName = "auto"
    # "dummy": the model built from its config.json with random weights (vLLM's name), for
    # capacity planning; never the default, and /readyz and the start-up log say so.
    load_format: LoadFormat = "auto"
    # Where the engine runs (engines/process/engine.py). torch releases and re-takes the
    # interpreter lock on every operation, so any Python work beside it in one process (the
    # event loop serving HTTP) stalls the model (DESIGN.md 3). "auto": its own process for
    # the transformers engine, the server's process for the oracle simulator and for vLLM
    # (whose engine core has a process of its own); "on": its own process (transformers or
    # the oracle); "off": the server's process.
    engine_process: Literal["auto", "on", "off"] = "auto"
    # The engine process is supervised (issue 47): when it dies it is started again after
    # a backoff that begins at engine_restart_backoff_s and doubles with each restart that
    # fails, up to engine_restart_backoff_max_s (a model that cannot load is not retried in
    # a tight loop). /livez fails after engine_restart_failures_live restarts in a row have
    # failed, so that the orchestrator replaces the pod; until then /readyz says 503.
    engine_restart_backoff_s: float = Field(default=1.0, gt=0, le=600)
    engine_restart_backoff_max_s: float = Field(default=30.0, gt=0, le=3600)
    engine_restart_failures_live: int = Field(default=5, ge=1, le=1000)
    # A label-scoring call of more prompts than this (a voting answer of T partitions) is
    # sent to the engine process in chunks of this many, one after another: a request whose
    # client left stops between chunks instead of computing all T (issue 47). 0: one call.
    # 16, not 8: the paper's T = 10 stays one call (a chunked answer runs its chunks one
    # after another, which at 8 doubled a lone T = 10 answer's round trips), and T = 40
    # leaves 38% of its work after a disconnect (73% before; docs/architecture.md).
    engine_chunk_prompts: int = Field(default=16, ge=0, le=65_536)
    cache_dir: Path = Path.home() / ".cache" / "dpicl"
    # SecretStr: a repr or a log of the settings shows "**********", never a token.
    admin_token: SecretStr | None = None
    # Static keys: unscoped, unlimited, no restart-free revocation (database keys,
    # POST /v1/keys, are all three); their id in the spend record is static-<8 hex of scrypt>.
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    whitebox: WhiteBox = "off"
    docs: bool = Field(
        default=True,
        description="Serve /docs and /redoc (assets served locally, no CDN); false: neither.",
    )
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # What one connection may cost before the app sees a request (api/http_limits.py):
    # uvicorn's httptools parser has no limit on a request's head (it took a 200 MiB header)
    # and no deadline on a head or a body short of its Content-Length (a client trickling
    # bytes held a request forever). 64 KiB of head is 8 times what nginx and Go accept by
    # default line by line and far beyond any client of this API (its URLs and headers are
    # short); 100 header fields is Apache's default. A head arrives in one packet from any
    # real client, so 10 s only cuts off stalled ones; a 4 MiB body in 30 s needs 140 KB/s.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_header_count: int = Field(default=100, ge=1, le=10_000)
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # Open connections (and requests in progress) past which a new request gets 503
    # server_busy at once (uvicorn's limit_concurrency). Each request may hold a body of
    # DPICL_MAX_BODY_BYTES: 512 x 4 MiB bounds that memory at 2 GiB, and 512 file descriptors
    # stay below the common limit of 1024. One engine answers a few dozen requests at a time;
    # more would only queue.
    max_connections: int = Field(default=512, ge=1, le=1_000_000)
    # Limits on what a request may ask for. The request schema holds hard bounds (see
    # dpicl.domain) inside which every computation has bounded cost; these only tighten them.
    max_exemplars: int = Field(default=10_000, gt=0, le=10_000)
    max_labels: int = Field(default=100, gt=1, le=1000)
    max_partitions: int = Field(default=1000, gt=0, le=10_000)
    max_epsilon: float = Field(default=100.0, gt=0, le=100.0)
    max_budget_epsilon: float = Field(default=1000.0, gt=0, le=1000.0)
    max_query_chars: int = Field(default=8_000, gt=0, le=20_000)
    # One synthesis request runs one DPS-MOZO generation per input, start to end in one
    # request: this bounds its time (each input costs what one /v1/generate does). Larger
    # sets are sent as several requests.
    max_synthesize_inputs: int = Field(default=100, gt=0, le=MAX_SYNTHESIZE_INPUTS)
    allow_unbudgeted: bool = Field(
        default=False,
        description='Accept contexts created with "budget": null, which answer forever.',
    )
    # Storage: how long a statement may wait for a lock (SQLite busy timeout, PostgreSQL
    # lock_timeout and statement_timeout) and how many threads run database work, apart
    # from the engine's, so a stuck database cannot starve other requests.
    db_timeout_s: float = Field(default=5.0, gt=0, le=300)
    db_threads: int = Field(default=8, ge=1, le=64)
    # Lean request path (issue 13): contexts' immutable fields cached per process (the
    # ledger is always the database's), and SQLite writes of this process taken one at a
    # time (two charges never meet in SQLite's sleeping busy handler; off only to compare).
    context_cache_mb: int = Field(default=64, ge=0, le=65_536)
    db_serialize_sqlite_writes: bool = True
    # Group commit (issue 30): charges that arrive while this process writes another group
    # go together in one transaction once it is done, or after waiting this long
    # (dpicl.store.group_commit); 0: one transaction per charge.
    ledger_group_commit_ms: float = Field(default=5.0, ge=0, le=1000)
    # Server processes on one port (api/workers.py): one Python process answers on at most
    # one core at a time (the GIL), so a host with more cores serves more with more
    # processes, each with its own engine and group commit, all on one ledger (atomic
    # across processes). Not with vLLM: each process would start its own engine on the GPU.
    workers: int = Field(default=1, ge=1, le=256)
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    # Operations (docs/deploy.md): log lines as JSON objects or text; GET /metrics behind the
    # admin token (its per-context budget metrics name context ids), open, or off.
    log_format: Literal["json", "text"] = "text"
    metrics: Literal["admin", "open", "off"] = "admin"
    # The sentence embedder loads at start (so the first ESA answer is not slow and /readyz
    # tells whether it loads); None: at start for a language-model engine, on first use
    # for the oracle simulator (its tests seldom need one).
    preload_embedder: bool | None = None
    # The vLLM engine (DPICL_ENGINE=vllm; engines/vllm/engine.py). None: vLLM's platform default.
    vllm_block_size: int = Field(default=32, gt=0, description="Prefix-cache block (tokens).")
    vllm_prefix_caching: bool = True
    vllm_gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    vllm_kv_cache_gib: float | None = Field(default=None, gt=0)
    vllm_max_model_len: int | None = Field(default=None, gt=0)
    vllm_enforce_eager: bool = False
    # vLLM's parallelism (engine args tensor_parallel_size, data_parallel_size): GPUs per
    # model copy and copies per server process; the pod then asks for their product of GPUs.
    vllm_tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    vllm_data_parallel_size: int = Field(default=1, ge=1, le=64)
    cache_salt_secret: SecretStr | None = Field(
        default=None,
        description="Keys the per-context prefix-cache salt; random per process when unset.",
    )

    # Transformers engine serving (engines/tuning.py): the per-context prompt-prefix KV
    # cache (0 MiB turns it off), the scratch memory scoring batches keep for laying out
    # their cached prefixes, and micro-batching of concurrent label-scoring requests.
    # prefix_cache_mib unset: 256 MiB on the CPU, 40% of the device memory left free after
    # the weights on a GPU (engines/placement.py). batch_wait_ms 0: a batch starts as soon
    # as the engine is free, with what queued while it was busy.
    prefix_cache_mib: int | None = Field(default=None, ge=0, le=1_048_576)
    prefix_cache_entries: int = Field(default=4096, ge=1, le=10_000_000)
    kv_workspace_mib: int = Field(default=128, ge=0, le=1_048_576)
    batch_wait_ms: float = Field(default=0.0, ge=0, le=1000)
    batch_max_prompts: int = Field(default=256, ge=1, le=65_536)
    # Warm scoring batches attend to cached prefixes in place rather than copying them per
    # row (engines/transformers/shared_prefix.py); auto: where measured not slower.
    shared_prefix: Literal["auto", "on", "off"] = "auto"
    # The score batcher launches the next batch before reading the last one back
    # (engines/transformers/batching.py, "Overlap"); auto: on CUDA only.
    engine_overlap: Literal["auto", "on", "off"] = "auto"
    # torch's CPU threads (engines/threads.py). Unset: the cores this process may use (its
    # affinity, capped by a cgroup CPU quota), not torch's default of all the host's CPUs.
    torch_threads: int | None = Field(default=None, ge=1, le=1024)
    torch_interop_threads: int | None = Field(default=None, ge=1, le=1024)
    # How torch's idle OpenMP threads wait: "passive" sleeps (spinning threads starve the
    # others on a shared machine: x15-20 slower generation under load, issue 30), "active"
    # spins (a machine of the server's own may gain a little), "inherit" leaves
    # OMP_WAIT_POLICY as the environment has it. An OMP_WAIT_POLICY already set wins.
    omp_wait_policy: Literal["passive", "active", "inherit"] = "passive"

    @field_validator("workers")
    @classmethod
    def _workers_fit_engine(cls, value: int, info: ValidationInfo) -> int:
        # A field validator (engine is declared, so validated, before workers): the error
        # then names DPICL_WORKERS.
        if value > 1 and info.data.get("engine") == "vllm":
            raise ValueError(
                f"{value} workers with DPICL_ENGINE=vllm: each worker process would start "
                "its own vLLM engine on the same GPUs; serve vLLM with one worker (its "
                "engine batches every request) and scale with DPICL_VLLM_DATA_PARALLEL_SIZE"
            )
        return value

    @field_validator("engine_process")
    @classmethod
    def _process_fits_engine(cls, value: str, info: ValidationInfo) -> str:
        if value == "on" and info.data.get("engine") == "vllm":
            raise ValueError(
                "DPICL_ENGINE_PROCESS=on with DPICL_ENGINE=vllm: vLLM runs its engine core in "
                "a process of its own already; leave it at auto"
            )
        return value

    def separate_engine_process(self) -> bool:
        """Whether the engine runs in a process of its own (DPICL_ENGINE_PROCESS)."""
        if self.engine_process == "auto":
            return self.engine == "transformers"
        return self.engine_process == "on"

    @field_validator("database_url")
    @classmethod
    def _is_url(cls, value: str) -> str:
        # Checked here, so a typo is a settings error at start rather than a traceback.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(value)
        except ArgumentError:
            raise ValueError(
                "not a SQLAlchemy database URL (sqlite:///path or postgresql+psycopg://...)"
            ) from None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        # uvicorn knows "debug", logging "DEBUG": operators type either.
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        # DPICL_API_KEYS="k1,k2": a comma-separated list is what operators type.
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    def embedder_at_start(self) -> bool:
        """Whether the embedder loads at start (DPICL_PRELOAD_EMBEDDER; see the field)."""
        if self.preload_embedder is not None:
            return self.preload_embedder
        return self.engine != "oracle"

    def with_generated_secrets(self) -> tuple[Settings, bool]:
        """Return settings with an admin token, and whether it had to be generated."""
        if self.admin_token is not None and self.admin_token.get_secret_value():
            return self, False
        token = SecretStr(secrets.token_urlsafe(32))
        return self.model_copy(update={"admin_token": token}), True
