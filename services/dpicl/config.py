"""Server settings: one pydantic-settings class, every field overridable as ``DPICL_<FIELD>``
(or from a ``.env`` file). Secure by default: white-box off, admin token required (one is
generated and printed at start when none is configured).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

EngineName = Literal["transformers", "oracle", "vllm"]
WhiteBox = Literal["off", "noisy", "internal"]


class Settings(BaseSettings):
    """Everything the server reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix="DPICL_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = 8000
    database_url: str = "sqlite:///./dpicl.db"
    engine: EngineName = "transformers"
    model: str | None = Field(
        default=None, description="Model directory or hub name; None is the bundled SmolLM2."
    )
    embedder: str | None = Field(
        default=None, description="sentence-transformers directory; None is bundled MiniLM."
    )
    device: str = "cpu"
    cache_dir: Path = Path.home() / ".cache" / "dpicl"
    admin_token: str | None = None
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    whitebox: WhiteBox = "off"
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_exemplars: int = Field(default=10_000, gt=0)
    max_query_chars: int = Field(default=8_000, gt=0)
    log_level: str = "info"
    # The vLLM engine (DPICL_ENGINE=vllm; engines/vllm.py). None: vLLM's platform default.
    vllm_block_size: int = Field(default=32, gt=0, description="Prefix-cache block (tokens).")
    vllm_prefix_caching: bool = True
    vllm_gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    vllm_kv_cache_gib: float | None = Field(default=None, gt=0)
    vllm_max_model_len: int | None = Field(default=None, gt=0)
    vllm_enforce_eager: bool = False
    cache_salt_secret: SecretStr | None = Field(
        default=None,
        description="Keys the per-context prefix-cache salt; random per process when unset.",
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        # DPICL_API_KEYS="k1,k2": a comma-separated list is what operators type.
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    def with_generated_secrets(self) -> tuple[Settings, bool]:
        """Return settings with an admin token, and whether it had to be generated."""
        if self.admin_token:
            return self, False
        return self.model_copy(update={"admin_token": secrets.token_urlsafe(32)}), True
