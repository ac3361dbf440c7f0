"""The debug-switch probe's comparison (issue 44, item 4; probes/switches.py): key sets of a
switched answer against the plain answers' and the OpenAPI document's, deterministic (no
randomness: an honest server's switched answer has the plain answer's keys)."""

from __future__ import annotations

import json

import httpx

from dpicl_audit.probes.switches import _conclude, declared_keys, key_paths, shape, undocumented

_PATH = "/v1/chat/completions"


def _answer(
    body: object, status: int = 200, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers or {})


def _stream(*chunks: object) -> httpx.Response:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


PLAIN = {"choices": [{"message": {"content": "Yes"}}], "dpicl": {"cost": {"epsilon": 1.0}}}


def test_key_paths_name_nested_keys_and_list_items() -> None:
    assert key_paths(PLAIN) == {
        "choices",
        "choices[].message",
        "choices[].message.content",
        "dpicl",
        "dpicl.cost",
        "dpicl.cost.epsilon",
    }
    assert "header x-debug" in shape("chat", _answer(PLAIN, headers={"X-Debug": "1"}))
    assert "header date" not in shape("chat", _answer(PLAIN, headers={"Date": "now"}))
    assert "chunk choices[].delta.votes" in shape(
        "chat-stream", _stream({"choices": [{"delta": {"votes": [1]}}]})
    )


def test_documented_keys_come_from_the_openapi_answer_too() -> None:
    doc = {
        "paths": {
            _PATH: {
                "post": {
                    "responses": {
                        "200": {
                            "content": {
                                "application/json": {"schema": {"$ref": "#/components/schemas/A"}}
                            }
                        }
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "A": {
                    "properties": {
                        "system_fingerprint": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                        "meta": {"type": "object", "additionalProperties": True},
                    }
                }
            }
        },
    }
    keys, open_ = declared_keys(doc, _PATH)
    assert keys == {"body system_fingerprint", "body meta"} and open_ == {"body meta."}
    found = {"body system_fingerprint", "body meta.anything", "body debug"}
    assert undocumented(found, keys, open_) == ["body debug"]


def _run(switched: dict[tuple[str, str, str], httpx.Response | str]) -> dict[str, object]:
    plain = {"chat": [_answer(PLAIN), _answer(PLAIN)]}
    asked = {("chat", s): got for s, got in switched.items()}
    return dict(_conclude({"chat": _PATH}, plain, asked, None))


def test_a_switch_adding_a_field_or_changing_the_status_class_is_a_violation() -> None:
    debug = PLAIN | {"debug": {"clean_votes": [3, 1]}}
    got = _run(
        {
            ("query", "debug", "1"): _answer(debug),
            ("header", "X-Debug", "1"): _answer(PLAIN),
            ("query", "raw", "1"): _answer({"error": "no"}, status=400),
            ("query", "trace", "1"): _answer(PLAIN, status=500),
        }
    )
    assert got["status"] == "violation"
    first, second = got["findings"]  # type: ignore[misc]
    assert first == {
        "switch": "?debug=1",
        "route": "chat",
        "status_code": 200,
        "extra": ["body debug", "body debug.clean_votes"],
    }
    assert second["switch"] == "?trace=1" and second["status_code"] == 500
    assert "?debug=1 on the chat route" in str(got["message"])
    assert got["refused"] == ["chat ?raw=1: 400"]


def test_an_honest_server_reads_ok_and_a_route_without_answers_is_not_checked() -> None:
    got = _run({("query", "debug", "1"): _answer(PLAIN, headers={"X-Request-Id": "abc"})})
    assert got["status"] == "ok" and got["findings"] == [], got
    none = _conclude({"chat": _PATH}, {"chat": ["no-route"]}, {}, None)
    assert none["status"] == "unchecked" and none["routes"] == []
