"""The parameter sweep's list of client parameters (issue 44, item 4): taken from the
official ``openai`` SDK (the snapshot in dpicl_audit/data must equal what the installed SDK
says: rewrite it with ``python -m dpicl_audit.probes.client_schema``), each with a value, and
every one of them swept on its route."""

from __future__ import annotations

import json

from dpicl_audit.probes.client_schema import (
    OWN_FIELDS,
    SNAPSHOT,
    VALUES,
    declared,
    example,
    from_sdk,
    sdk_parameters,
    values_for,
)
from dpicl_audit.probes.parameters import VARIANTS, schema_variants


def test_the_snapshot_is_the_installed_sdks() -> None:
    assert json.loads(SNAPSHOT.read_text()) == from_sdk(), (
        "the openai SDK's request parameters changed: run "
        "`python -m dpicl_audit.probes.client_schema` and choose values for new ones (VALUES)"
    )


def test_every_sdk_parameter_has_a_chosen_value() -> None:
    for route, names in sdk_parameters().items():
        missing = sorted(set(names) - OWN_FIELDS[route] - set(VALUES))
        assert not missing, f"{route}: choose values in client_schema.VALUES for {missing}"


def test_every_parameter_of_every_route_is_swept() -> None:
    openapi = {
        "paths": {
            "/v1/classify": {
                "post": {
                    "requestBody": {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/C"}}
                        }
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "C": {
                    "properties": {
                        "context_id": {"type": "string"},
                        "query": {"type": "string"},
                        "explain": {"type": "boolean", "default": False},
                        "mode": {"enum": ["public", "internal"], "default": "public"},
                    }
                }
            }
        },
    }
    got = schema_variants(("chat", "completions", "native"), openapi)
    core = {(route, k) for _, route, extra in VARIANTS for k in extra}
    sent = {(route, k) for _, route, extra in got for k in extra}
    for route, names in sdk_parameters().items():
        for name in set(names) - OWN_FIELDS[route]:
            assert (route, name) in sent | core, (route, name)
    native = [e for _, r, e in got if r == "native"]
    assert native == [{"explain": True}, {"mode": "internal"}]
    assert {e["seed"] for _, r, e in got if "seed" in e} == {7, 8}
    assert values_for("completions", "logprobs", None) == (5,)
    assert values_for("chat", "logprobs", None) == (True,)
    assert declared(None, "/v1/classify") == {}


def test_example_asks_for_what_the_default_does_not() -> None:
    assert example({"type": "boolean", "default": True}) is False
    assert example({"type": "integer", "minimum": 1, "maximum": 8}) == 8
    assert example({"enum": ["off", "noisy", "internal"], "default": "off"}) == "internal"
    assert example({"anyOf": [{"type": "null"}, {"type": "number", "maximum": 2}]}) == 2.0
    assert example({"type": "array", "items": {"type": "string", "maxLength": 5}}) == ["dpicl"]
    assert example(
        {"type": "object", "required": ["a"], "properties": {"a": {"const": 1}, "b": {}}}
    ) == {"a": 1}
