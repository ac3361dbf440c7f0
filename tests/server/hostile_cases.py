"""Hostile and unlucky inputs (issue 12 and more), as data: each is one request with the
status it must get and the word its error must name. Shared by the in-process test and the
one against a real ``dpicl serve`` on PostgreSQL under a memory limit."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.server.api_helpers import voting_context

#: Written into exemplars of refused requests; must never appear in a server log.
SECRET = "SECRET-EXEMPLAR-7f3a"


def json_log(records: list[Any]) -> str:
    """Log records as the server writes them with DPICL_LOG_FORMAT=json (every field of
    every line, the access log's included): what a leak check must search too."""
    from dpicl.logging_setup import JsonFormatter

    fmt = JsonFormatter()
    return "\n".join(fmt.format(r) for r in records)


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    status: int
    names: str  # what the error's param or message must mention
    body: Any = None  # JSON-encoded unless ``raw`` is given
    raw: bytes | None = None
    user: bool = False  # user key instead of the admin token
    headers: dict[str, str] = field(default_factory=dict)
    http_client_can_send: bool = True  # False: only an ASGI test client sends it as is

    def content(self) -> bytes | None:
        if self.raw is not None:
            return self.raw
        if self.body is None:
            return None
        # allow_nan: Python's json module (FastAPI's parser) reads NaN and Infinity.
        return json.dumps(self.body, allow_nan=True).encode()


def _voting(**mechanism: Any) -> dict[str, Any]:
    body = voting_context(mechanism=mechanism, budget={"epsilon": 10.0, "delta": 1e-5})
    body["exemplars"][0]["input"] = f"{SECRET} customer record"
    return body


def _esa(**mechanism: Any) -> dict[str, Any]:
    return {
        "task": "generation",
        "exemplars": [{"input": f"{SECRET} q{i}", "output": f"a{i}"} for i in range(8)],
        "mechanism": {"name": "esa", "epsilon": 1.0, "partitions": 4, **mechanism},
        "budget": {"epsilon": 10.0, "delta": 1e-5},
    }


def _mozo(**mechanism: Any) -> dict[str, Any]:
    return {
        "task": "generation",
        "exemplars": [{"input": f"{SECRET} q{i}", "output": f"a{i}"} for i in range(8)],
        "mechanism": {"name": "dps-mozo", "epsilon": 4.0, "queries": 10, **mechanism},
    }


def _with(body: dict[str, Any], **top: Any) -> dict[str, Any]:
    return body | top


def context_cases() -> list[Case]:
    """POST /v1/contexts (admin)."""

    def c(name: str, body: Any, names: str, status: int = 422, **kw: Any) -> Case:
        return Case(name, "POST", "/v1/contexts", status, names, body=body, **kw)

    many = voting_context(budget={"epsilon": 1.0, "delta": 1e-5})
    many["exemplars"] = [{"input": "a", "output": "Yes"} for _ in range(100_000)]
    no_budget = voting_context()
    del no_budget["budget"]
    return [
        # 1. the remote OOM kill and the slow 500
        c("epsilon 1.97e11", _voting(epsilon=1.97e11), "mechanism.voting.epsilon"),
        c("epsilon 1e9", _voting(epsilon=1e9), "mechanism.voting.epsilon"),
        # 2. extreme values
        c("epsilon 1e308", _voting(epsilon=1e308), "mechanism.voting.epsilon"),
        c("epsilon 1e-300", _voting(epsilon=1e-300), "mechanism.voting.epsilon"),
        c("epsilon 5e-324", _voting(epsilon=5e-324), "mechanism.voting.epsilon"),
        c("epsilon NaN", _voting(epsilon=float("nan")), "mechanism.voting.epsilon"),
        c("epsilon inf", _voting(epsilon=float("inf")), "mechanism.voting.epsilon"),
        c("epsilon -1", _voting(epsilon=-1.0), "mechanism.voting.epsilon"),
        c("epsilon string", _voting(epsilon="lots"), "mechanism.voting.epsilon"),
        c("epsilon list", _voting(epsilon=[1.0]), "mechanism.voting.epsilon"),
        # lax pydantic read true as 1 and "4" as 4: wrong types, not numbers
        c("epsilon true", _voting(epsilon=True), "mechanism.voting.epsilon"),
        c("epsilon '1'", _voting(epsilon="1"), "mechanism.voting.epsilon"),
        c("partitions true", _voting(partitions=True), "mechanism.voting.partitions"),
        c("partition_seed '7'", _voting(partition_seed="7"), "mechanism.voting.partition_seed"),
        c(
            "budget delta '1e-5'",
            _with(_voting(), budget={"epsilon": 1.0, "delta": "1e-5"}),
            "budget.delta",
        ),
        c("mozo queries true", _mozo(queries=True), "queries"),
        c("mozo delta true", _mozo(delta=True), "delta"),
        c("mozo alpha '8'", _mozo(guarantee="paper", alpha="8"), "alpha"),
        c(
            "budget epsilon 1e308",
            _with(_voting(), budget={"epsilon": 1e308, "delta": 1e-5}),
            "budget.epsilon",
        ),
        c(
            "budget delta 1",
            _with(_voting(), budget={"epsilon": 1.0, "delta": 1.0}),
            "budget.delta",
        ),
        c("delta 1e-320", _voting(delta=1e-320), "mechanism.voting.delta"),
        c("delta 1", _voting(delta=1.0), "mechanism.voting.delta"),
        c("delta 0", _voting(delta=0.0), "mechanism.voting.delta"),
        c("ESA epsilon 1e300", _esa(epsilon=1e300), "mechanism.esa.epsilon"),
        c("ESA candidates 1e9", _esa(candidates=10**9), "mechanism.esa.candidates"),
        # 3. hash partitioning and T <= |D|
        c("hash T 1e9", _voting(partitioning="hash", partitions=10**9), "partitions"),
        c("hash T > |D|", _voting(partitioning="hash", partitions=50), "partitions"),
        c("T 0", _voting(partitions=0), "partitions"),
        c("T float", _voting(partitions=2.5), "partitions"),
        c("seed 2^64", _voting(partition_seed=2**64), "partition_seed"),
        c("temperature inf", _voting(temperature=float("inf")), "temperature"),
        # 4. DPICL_MAX_EXEMPLARS
        c("100,000 exemplars", many, "exemplars"),
        # 5. NUL bytes and other strings no store can hold
        c("NUL in name", _with(_voting(), name="a\x00b"), "name"),
        c(
            "NUL in template",
            _with(_voting(), template="{exemplars}\x00{query}"),
            "template",
        ),
        c("NUL in label", _with(_voting(), labels=["Yes", "N\x00o"]), "labels"),
        c(
            "lone surrogate in exemplar",
            _with(_voting(), exemplars=[{"input": "a\ud800", "output": "Yes"}]),
            "exemplars.0.input",
        ),
        # blank texts: an exemplar of spaces demonstrates nothing, labels of spaces look alike
        c(
            "blank exemplar input",
            _with(_voting(partitions=1), exemplars=[{"input": " \t\n", "output": "Yes"}]),
            "exemplars.0.input",
        ),
        c(
            "blank labels",
            _with(
                _voting(partitions=1),
                labels=[" ", "  "],
                exemplars=[{"input": "a", "output": " "}, {"input": "b", "output": "  "}],
            ),
            "labels.0",
        ),
        c(
            "blank ESA output",
            _with(_esa(partitions=1), exemplars=[{"input": "q", "output": "\u3000"}]),
            "output",
        ),
        # invisible is blank too: zero-width spaces and joiners, the word joiner, the BOM
        c(
            "invisible exemplar input",
            _with(
                _voting(partitions=1),
                exemplars=[{"input": "\u200b\u200c\u2060\ufeff", "output": "Yes"}],
            ),
            "exemplars.0.input",
        ),
        c(
            "invisible label",
            _with(
                _voting(partitions=1),
                labels=["Yes", "\u200b\u00ad"],
                exemplars=[{"input": "a", "output": "Yes"}],
            ),
            "labels.1",
        ),
        # labels a reader cannot tell apart in an answer
        c(
            "labels NFC/NFD",
            _with(
                _voting(partitions=1),
                labels=["e\u0301", "\u00e9"],
                exemplars=[{"input": "a", "output": "\u00e9"}],
            ),
            "labels.1",
        ),
        c(
            "labels 'Yes' and 'Yes '",
            _with(
                _voting(partitions=1),
                labels=["Yes", "Yes "],
                exemplars=[{"input": "a", "output": "Yes"}],
            ),
            "differ only in Unicode normalisation, invisible characters or surrounding",
        ),
        c(
            "labels 'Yes' and 'Ye\\u200bs'",
            _with(
                _voting(partitions=1),
                labels=["Yes", "Ye\u200bs"],
                exemplars=[{"input": "a", "output": "Yes"}],
            ),
            "labels.1",
        ),
        # huge strings and lists
        c("name of 10k chars", _with(_voting(), name="n" * 10_000), "name"),
        c(
            "exemplar of 30k chars",
            _with(_voting(), exemplars=[{"input": "x" * 30_000, "output": "Yes"}]),
            "exemplars.0.input",
        ),
        c("5000 labels", _with(_voting(), labels=[f"l{i}" for i in range(5000)]), "labels"),
        c("nested 500 deep", _with(_voting(), name=json.loads("[" * 500 + "]" * 500)), "name"),
        # each slot is filled once per prompt: 1,800 "{exemplars}" made 1,800 copies
        c(
            "template {exemplars} x1800",
            _with(_voting(), template="{exemplars}" * 1800 + "{query}"),
            "{exemplars} exactly once (it has 1800)",
        ),
        c(
            "template {query} twice",
            _with(_voting(), template="{exemplars}{query}{query}"),
            "{query} exactly once (it has 2)",
        ),
        c(
            "template {labels} x2000",
            _with(_voting(), template="{exemplars}{query}" + "{labels}" * 2000),
            "{labels} at most once (it has 2000)",
        ),
        # 12. a budget is required; "budget": null needs DPICL_ALLOW_UNBUDGETED
        c("no budget", no_budget, "budget"),
        c("budget null", voting_context(), "DPICL_ALLOW_UNBUDGETED"),
        # DPS-MOZO parameters
        c("mozo queries 1e12", _mozo(queries=10**12), "queries"),
        c("mozo top_k 1e9", _mozo(top_k=10**9), "top_k"),
        c("mozo alpha 1e9", _mozo(alpha=10**9), "alpha"),
        c("mozo max_tokens 1e9", _mozo(max_tokens=10**9), "max_tokens"),
        c("mozo n_shots 1e9", _mozo(n_shots=10**9), "n_shots"),
        c("mozo lambda_max NaN", _mozo(lambda_max=float("nan")), "lambda_max"),
        c("mozo epsilon 1e300", _mozo(epsilon=1e300), "epsilon"),
        # bodies that are not what they claim
        c("bad JSON", None, "JSON", status=400, raw=b'{"task": '),
        c("invalid UTF-8", None, "JSON", status=400, raw=b'{"name": "\xff\xfe"}'),
        c("nested 100k deep", None, "JSON", status=400, raw=b"[" * 100_000 + b"]" * 100_000),
        c("array body", [], "body"),
        # the 400 and the 422 name what is wrong with the bytes
        c("bad JSON at", None, "at character 9", status=400, raw=b'{"task": '),
        c("invalid UTF-8 byte", None, "xff", status=400, raw=b'{"name": "\xff\xfe"}'),
        c("deep nesting named", None, "nested", status=400, raw=b"[" * 100_000 + b"]" * 100_000),
        c(
            "integer of 5000 digits",
            None,
            "5000 digits",
            status=400,
            raw=b'{"mechanism": {"name": "voting", "epsilon": ' + b"1" * 5000 + b"}}",
        ),
        c(
            "text/plain body",
            voting_context(),
            "Content-Type: application/json (got 'text/plain')",
            headers={"content-type": "text/plain"},
        ),
        c("null body", None, "body", raw=b"null"),
    ]


def inference_cases(context_id: str) -> list[Case]:
    """Queries (user key) against an existing voting context ``context_id``."""

    def q(name: str, body: Any, names: str, status: int = 422, path: str = "/v1/classify") -> Case:
        return Case(name, "POST", path, status, names, body=body, user=True)

    return [
        q("empty query", {"context_id": context_id, "query": ""}, "query"),
        q("blank query", {"context_id": context_id, "query": " \t\n"}, "query"),
        q(
            "invisible query",
            {"context_id": context_id, "query": "\u200b\u200c\u2060\ufeff"},
            "query",
        ),
        q(
            "whitespace and invisible query",
            {"context_id": context_id, "query": " \u200b\t\u3000\ufeff\u200d\n"},
            "query",
        ),
        q(
            "invisible generate query",
            {"context_id": context_id, "query": "\u2060\u180e\u3164"},
            "query",
            path="/v1/generate",
        ),
        q("NUL in query", {"context_id": context_id, "query": "a\x00b"}, "query"),
        q("query of 1M chars", {"context_id": context_id, "query": "q" * 1_000_000}, "query"),
        q("query int", {"context_id": context_id, "query": 5}, "query"),
        q("NUL in context_id", {"context_id": "ctx_\x00", "query": "hi"}, "context_id", 404),
        q("unknown context_id", {"context_id": "ctx_" + "0" * 24, "query": "hi"}, "ctx_", 404),
        q("long context_id", {"context_id": "c" * 10_000, "query": "hi"}, "context_id"),
        q(
            "max_tokens 1e9",
            {"context_id": context_id, "query": "hi", "max_tokens": 10**9},
            "max_tokens",
            path="/v1/generate",
        ),
        q(
            "max_tokens -1",
            {"context_id": context_id, "query": "hi", "max_tokens": -1},
            "max_tokens",
            path="/v1/generate",
        ),
        q("extra field", {"context_id": context_id, "query": "hi", "x": 1}, "x"),
        q(
            "max_tokens true",
            {"context_id": context_id, "query": "hi", "max_tokens": True},
            "max_tokens",
            path="/v1/generate",
        ),
        # Refused by the path parameter's schema (issue 47), before any lookup.
        Case("NUL in path id", "GET", "/v1/contexts/ctx_%00", 422, "context_id"),
        # the listing's page size and cursor
        Case("list limit 0", "GET", "/v1/contexts?limit=0", 422, "limit"),
        Case("list limit 1e9", "GET", "/v1/contexts?limit=1000000000", 422, "limit"),
        Case("list limit abc", "GET", "/v1/contexts?limit=abc", 422, "limit"),
        Case("list cursor junk", "GET", "/v1/contexts?cursor=not-a-cursor", 422, "cursor"),
        Case("list cursor long", "GET", "/v1/contexts?cursor=" + "A" * 5000, 422, "cursor"),
        Case(
            "list cursor of a bad id",
            "GET",
            # base64url of "2026-01-01T00:00:00+00:00 ctx_x": a timestamp, but no context id
            "/v1/contexts?cursor=MjAyNi0wMS0wMVQwMDowMDowMCswMDowMCBjdHhfeA",
            422,
            "cursor",
        ),
        Case(
            "huge Content-Length",
            "POST",
            "/v1/contexts",
            413,
            "bytes",
            raw=b"{}",
            headers={"content-length": str(10**12)},
            http_client_can_send=False,
        ),
        Case("PUT classify", "PUT", "/v1/classify", 405, "Method Not Allowed", user=True),
    ]
