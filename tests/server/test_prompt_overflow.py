"""A private prompt that does not fit the model must not decide whether an answer fails.

Before the fix, :meth:`dpicl.engines.prompting.PromptEncoder.encode` refused a partition
prompt (or a DPS-MOZO one-shot prompt) longer than the model's context with a 422 naming its
token count, raised inside the paid engine call and therefore refunded. Any user could then
tell neighbouring contexts apart with certainty and for free (a long canary exemplar makes
its partition's prompt overflow; varying the query's length reads that prompt's exact token
count). The release was the outcome of a deterministic function of the exemplars: no
sigma makes that DP.

Now the pipelines give every private prompt the public zero-shot prompt of the same query as
its ``fallback``: a partition (or shot) whose prompt does not fit is answered from the
zero-shot prompt, which is still a function of that partition's exemplars and the query only
(paper 000, Algorithm 2: any per-partition function keeps Delta2 = sqrt(2); paper 004:
a shot whose distribution is p0 is within eps0 of p0). The only refusal left depends on the
query and the template alone, and it is the same for every context with that template.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.oracle.engine import OracleDecodingSession, OracleEngine
from dpicl.engines.prompting import PromptEncoder
from dpicl.errors import InvalidRequest
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import CharTokenizer, make_client, voting_context
from tests.server.test_api_generate import esa_context
from tests.server.test_api_mozo import mozo_context

#: The toy model's context: long enough for every prompt of the ordinary contexts below
#: (the voting template is ~330 characters, two exemplars ~120, the query ~20), too short
#: for a prompt that holds the long canary.
MAX_POSITIONS = 900
LONG = "A very long private record. " * 60  # ~1680 characters


class TokenLimitedOracle(OracleEngine):
    """The oracle simulator behind a real :class:`PromptEncoder` with a context limit: each
    prompt is encoded as the transformers and vLLM engines encode it, and the oracle answers
    the prompt the encoder actually used."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = PromptEncoder(
            CharTokenizer(), model_name="toy", use_chat_template=False, max_positions=MAX_POSITIONS
        )
        self.used: list[PromptSpec] = []

    def _used(self, prompts: Sequence[PromptSpec]) -> list[PromptSpec]:
        out = []
        for p in prompts:
            rendered, _ = self.encoder.encode(p)
            chain = [p]
            while (nxt := getattr(chain[-1], "fallback", None)) is not None:
                chain.append(nxt)
            out.append(next(q for q in chain if q.text == rendered))
        self.used += out
        return out

    async def score_labels(self, prompts: Sequence[PromptSpec], labels: Sequence[str]) -> Any:
        return await super().score_labels(self._used(prompts), labels)

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> Any:
        return await super().generate(self._used(prompts), params)

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> OracleDecodingSession:
        return await super().open_decoding(
            self._used(prompts), zero_shot_index=zero_shot_index, top_k=top_k
        )


def _with_long_exemplar(body: dict[str, Any]) -> dict[str, Any]:
    """The replace-one neighbour: exemplar 0 replaced by a long one (same output)."""
    ex = [dict(e) for e in body["exemplars"]]
    ex[0]["input"] = LONG
    return body | {"exemplars": ex}


CASES = {
    "voting": (voting_context(), "/v1/classify"),
    "esa": (esa_context(), "/v1/generate"),
    "dps-mozo": (mozo_context(), "/v1/generate"),
}


@pytest.mark.parametrize("mechanism", list(CASES))
def test_a_prompt_overflow_does_not_tell_neighbours_apart(tmp_path: Path, mechanism: str) -> None:
    body, route = CASES[mechanism]
    engine = TokenLimitedOracle()
    with make_client(tmp_path, engine=engine) as client:
        for ctx in (body, _with_long_exemplar(body)):
            r = client.post("/v1/contexts", json=ctx, headers=admin_headers())
            assert r.status_code == 201, r.text
            cid = r.json()["id"]
            query = {"context_id": cid, "query": "Is record 3 here?"}
            r = client.post(route, json=query, headers=user_headers())
            # Answered and paid for, whichever neighbour it was.
            assert r.status_code == 200, r.text
            assert r.json()["budget"]["queries"] == 1
            assert "tokens" not in r.text
        # The long exemplar's prompt was replaced by the zero-shot prompt, never sent.
        assert all(LONG not in p.text for p in engine.used)


@pytest.mark.parametrize("mechanism", list(CASES))
def test_a_query_too_long_for_the_model_is_refused_for_every_neighbour(
    tmp_path: Path, mechanism: str
) -> None:
    body, route = CASES[mechanism]
    with make_client(tmp_path, engine=TokenLimitedOracle()) as client:
        seen = []
        for ctx in (body, _with_long_exemplar(body)):
            r = client.post("/v1/contexts", json=ctx, headers=admin_headers())
            cid = r.json()["id"]
            query = {"context_id": cid, "query": "q" * MAX_POSITIONS}
            r = client.post(route, json=query, headers=user_headers())
            assert r.status_code == 422, r.text
            # Nothing was released, so nothing is charged.
            info = client.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
            assert info["spent"]["queries"] == 0
            seen.append(r.json()["error"]["message"])
        # The refusal depends on the query and the template only.
        assert seen[0] == seen[1]


def test_the_fallback_is_checked_even_when_the_private_prompt_fits() -> None:
    """Whether a call fails must not depend on the private prompt at all: a fallback that
    does not fit is refused even where the private prompt would have fitted."""
    enc = PromptEncoder(CharTokenizer(), model_name="toy", max_positions=10)
    public = PromptSpec(text="x" * 12, query="q")
    private = PromptSpec(text="y" * 5, query="q", fallback=public)
    with pytest.raises(InvalidRequest, match="12 tokens"):
        enc.encode(private)
    fits = PromptSpec(text="y" * 20, query="q", fallback=PromptSpec(text="z" * 4, query="q"))
    assert enc.encode(fits)[0] == "z" * 4
    assert enc.encode_used(fits)[0].text == "z" * 4
