"""Context administration over the real app (oracle engine, real SQLite)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context


def test_create_get_list_delete(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        r = c.post("/v1/contexts", json=voting_context(name="t"), headers=admin_headers())
        assert r.status_code == 201, r.text
        info = r.json()
        cid = info["id"]
        assert info["n_exemplars"] == 8
        assert info["mechanism"]["partition_seed"] == 7
        # Algorithm 2 of paper 000, line 7: sigma = 2 sqrt(ln(1.25/delta)) / epsilon.
        assert info["mechanism"]["sigma"] == pytest.approx(2 * math.sqrt(math.log(1.25 / 1e-5)))
        assert "exemplars" not in info and "Private record" not in r.text
        got = c.get(f"/v1/contexts/{cid}", headers=admin_headers())
        assert got.status_code == 200
        assert "Private record" not in got.text
        assert got.json()["spent"]["queries"] == 0
        listing = c.get("/v1/contexts", headers=admin_headers()).json()["data"]
        assert [x["id"] for x in listing] == [cid]
        assert c.delete(f"/v1/contexts/{cid}", headers=admin_headers()).status_code == 204
        missing = c.get(f"/v1/contexts/{cid}", headers=admin_headers())
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"


def test_random_partition_seed_when_absent(tmp_path: Path) -> None:
    body = voting_context()
    body["mechanism"].pop("partition_seed")
    with make_client(tmp_path) as c:
        seeds = {
            c.post("/v1/contexts", json=body, headers=admin_headers()).json()["mechanism"][
                "partition_seed"
            ]
            for _ in range(3)
        }
    assert len(seeds) == 3


def test_admin_endpoints_need_admin_token(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        for headers in ({}, user_headers(), {"Authorization": "Bearer wrong"}):
            r = c.post("/v1/contexts", json=voting_context(), headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("patch", "param", "needle"),
    [
        ({"mechanism": {"epsilon": 0}}, "mechanism.voting.epsilon", "0"),
        ({"mechanism": {"epsilon": -1.5}}, "mechanism.voting.epsilon", "-1.5"),
        ({"mechanism": {"delta": 0}}, "mechanism.voting.delta", "0"),
        ({"mechanism": {"delta": 1.2}}, "mechanism.voting.delta", "1.2"),
        ({"mechanism": {"partitions": 9}}, "mechanism.partitions", "T=9"),
        ({"mechanism": {"partitions": 0}}, "mechanism.voting.partitions", "0"),
        ({"mechanism": {"calibration": "magic"}}, "mechanism.voting.calibration", "magic"),
        ({"mechanism": {"name": "laplace"}}, "mechanism", "laplace"),
        # An exemplar is private: named by index and field, never quoted (issue 25).
        ({"labels": ["Yes", "Maybe"]}, "exemplars.1.output", "exemplars.1.output is not"),
        ({"labels": ["Yes"]}, "labels", "['Yes']"),
        ({"template": "no slots here"}, "template", "{exemplars}"),
        ({"exemplars": []}, "exemplars", "at least 1 item"),
        ({"budget": {"epsilon": -1, "delta": 1e-5}}, "budget.epsilon", "-1"),
    ],
)
def test_bad_context_names_the_value(
    tmp_path: Path, patch: dict[str, object], param: str, needle: str
) -> None:
    body = voting_context()
    for k, v in patch.items():
        if k == "mechanism":
            body["mechanism"].update(v)  # type: ignore[arg-type]
        else:
            body[k] = v
    with make_client(tmp_path) as c:
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    assert err["param"] == param, err
    assert needle in err["message"], err


def test_malformed_json_and_oversized_body(tmp_path: Path) -> None:
    with make_client(tmp_path, max_body_bytes=2000) as c:
        r = c.post(
            "/v1/contexts",
            content=b'{"task": "classification", ',
            headers=admin_headers() | {"content-type": "application/json"},
        )
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "invalid_json"
        big = voting_context()
        big["exemplars"][0]["input"] = "x" * 5000
        r = c.post("/v1/contexts", json=big, headers=admin_headers())
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "payload_too_large"
        assert "2000" in r.json()["error"]["message"]
        # Nothing was stored by either refused request.
        assert c.get("/v1/contexts", headers=admin_headers()).json()["data"] == []
