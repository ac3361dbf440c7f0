"""Builders for API tests: an oracle-backed app in-process and context payloads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from dpicl.api.app import build_app
from dpicl.config import Settings
from dpicl.engines.base import Embedder, Engine
from tests.conftest import ADMIN, USER

AUDIT_TEMPLATE = (
    "You are a highly accurate text verification system. Your sole function is to verify if "
    "the text in the <query> tag is present in the <context> tag.\n\nYour response must be a "
    "single word: either 'Yes' or 'No'.\n\n<context>\n{exemplars}\n</context>\n\n"
    "<query>\n{query}\n</query>\n\n<response>"
)

TOPICS = [
    ("The central bank raised interest rates again this quarter", "Business"),
    ("The striker scored twice in the final minutes of the derby", "Sports"),
    ("Researchers unveiled a faster quantum processor prototype", "Sci/Tech"),
    ("Leaders met in Geneva to discuss the ceasefire proposal", "World"),
]


def exemplars(n: int, label_set: tuple[str, str] = ("Yes", "No")) -> list[dict[str, str]]:
    return [
        {
            "input": f"Private record number {i}: customer paid invoice {1000 + i}",
            "output": label_set[i % 2],
        }
        for i in range(n)
    ]


def voting_context(**overrides: Any) -> dict[str, Any]:
    mech = {"name": "voting", "epsilon": 1.0, "delta": 1e-5, "partitions": 4, "partition_seed": 7}
    mech.update(overrides.pop("mechanism", {}))
    body: dict[str, Any] = {
        "task": "classification",
        "labels": ["Yes", "No"],
        "exemplars": exemplars(8),
        "template": AUDIT_TEMPLATE,
        "mechanism": mech,
        # Explicitly unbudgeted (make_client allows it); tests of budgets pass their own.
        "budget": None,
    }
    body.update(overrides)
    return body


def make_client(
    tmp_path: Path,
    *,
    whitebox: str = "off",
    engine: Engine | None = None,
    embedder: Embedder | None = None,
    **settings: Any,
) -> TestClient:
    settings.setdefault("allow_unbudgeted", True)
    settings.setdefault("database_url", f"sqlite:///{tmp_path / 'dpicl.db'}")
    s = Settings(
        engine="oracle",
        admin_token=ADMIN,
        api_keys=[USER],
        whitebox=whitebox,  # type: ignore[arg-type]
        **settings,
    )
    return TestClient(build_app(s, engine=engine, embedder=embedder))


class CharTokenizer:
    """A toy tokenizer for engine tests: one token per (ASCII) character, so a prompt's
    token count is its length."""

    bos_token_id = 1
    eos_token_id = 2
    pad_token_id = 0
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
        return {"input_ids": [min(ord(c), 255) for c in text]}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i > 2)
