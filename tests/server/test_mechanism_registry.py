"""The mechanism registry: built-ins, and a mechanism installed from outside the package
(``examples/laplace_voting``) found through its entry point and served end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from dpicl.errors import ConfigurationError, InvalidRequest
from dpicl.mechanisms import registry
from dpicl.mechanisms.base import Mechanism

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "laplace_voting" / "laplace_voting"


def test_built_ins_are_registered_in_order() -> None:
    assert list(registry.MECHANISMS)[:4] == ["voting", "esa", "dps-mozo", "public"]
    assert registry.serving("classification")[0] == "voting"
    assert registry.serving("generation")[:3] == ["esa", "dps-mozo", "public"]
    # public contexts are derived, never created from a request
    names = [m.model_fields["name"].default for m in registry.settings_models()]
    assert names[:3] == ["voting", "esa", "dps-mozo"] and "public" not in names


def test_unknown_mechanism_names_the_value() -> None:
    with pytest.raises(InvalidRequest, match="'laplace-votin'"):
        registry.get_mechanism("laplace-votin")


def _fake_entry_points(*eps: EntryPoint):  # type: ignore[no-untyped-def]
    return lambda group: list(eps) if group == registry.ENTRY_POINT_GROUP else []


def test_a_broken_entry_point_stops_the_server_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint("nope", "no_such_module_xyz:THING", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(ep))
    with pytest.raises(ConfigurationError, match=r"'nope'.*failed to load"):
        registry.discover()


def test_an_entry_point_must_load_a_mechanism(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint("str", "os:sep", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(ep))
    with pytest.raises(ConfigurationError, match="loads str, not a dpicl"):
        registry.discover()


def test_an_entry_point_cannot_take_a_built_in_name(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint(
        "voting", "dpicl.mechanisms.voting.mechanism:VOTING", registry.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(ep))
    with pytest.raises(ConfigurationError, match="'voting', a name already taken"):
        registry.discover()


def test_a_mechanism_class_is_instantiated(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint("pub", "dpicl.mechanisms.dps_mozo.public:Public", registry.ENTRY_POINT_GROUP)
    assert isinstance(registry._load(ep), Mechanism)


# Run in a fresh interpreter: the registry (and the request schema built from it) is
# read once, at import, like a server started with the package installed.
SCRIPT = textwrap.dedent(
    """
    from dpicl.mechanisms.registry import MECHANISMS
    from dpicl.privacy.accounting import budget_mu2, pure_dp_mu2, spent_epsilon
    from tests.conftest import admin_headers, user_headers
    from tests.server.api_helpers import make_client, voting_context

    assert "laplace-voting" in MECHANISMS, list(MECHANISMS)

    # `dpicl calibrate` reads the registry: the plug-in's own calibration, its own options.
    import json
    from typer.testing import CliRunner
    from dpicl.cli import app
    cal = ["calibrate", "--mechanism", "laplace-voting", "--epsilon", "1", "--partitions", "4"]
    res = CliRunner().invoke(app, cal)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["scale"] == 2.0, res.output
    res = CliRunner().invoke(app, [*cal, "--delta", "1e-5"])
    assert res.exit_code == 2 and "--delta does not apply" in res.output, res.output

    canary = "Private record number 3: customer paid invoice 1003"
    body = voting_context(budget={"epsilon": 20.0, "delta": 1e-5})
    body["mechanism"] = {"name": "laplace-voting", "epsilon": 1.0, "partitions": 4,
                         "partition_seed": 7}
    with make_client(TMP, whitebox="internal") as c:
        spec = c.get("/openapi.json").json()
        assert "LaplaceVotingSettings" in spec["components"]["schemas"]
        r = c.post("/v1/contexts", json=body | {"budget": None}, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "budget", r.text
        bad = body | {"mechanism": body["mechanism"] | {"name": "laplace-votin"}}
        r = c.post("/v1/contexts", json=bad, headers=admin_headers())
        assert r.status_code == 422 and "laplace-votin" in r.text, r.text
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 201, r.text
        info = r.json()
        cid = info["id"]
        assert info["mechanism"]["scale"] == 2.0, info["mechanism"]
        left = info["spent"]["remaining_queries"]
        m2 = pure_dp_mu2(1.0)
        assert left == int(budget_mu2(20.0, 1e-5) / m2), (left, info)

        r = c.post("/v1/classify", json={"context_id": cid, "query": canary},
                   headers=user_headers())
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["label"] in ("Yes", "No")
        assert out["cost"]["epsilon"] == 1.0 and out["cost"]["delta"] == 0.0
        # the smaller of the GDP curve (5.6 at this delta) and basic composition (1.0)
        assert spent_epsilon(m2, 1e-5) > 1.0 and out["budget"]["spent_epsilon"] == 1.0

        r = c.post("/v1/debug/classify", json={"context_id": cid, "query": canary},
                   headers=admin_headers())
        assert r.status_code == 200, r.text
        dbg = r.json()
        assert dbg["clean_votes"] == {"Yes": 1, "No": 3}, dbg  # the canary's partition
        # Its own Laplace scale, from its own debug model; no Gaussian sigma claimed.
        assert dbg["scale"] == 2.0 and dbg["sigma"] is None, dbg
        schema = spec["components"]["schemas"]["DebugClassifyResponse"]
        assert "sigma" not in schema["required"] and "scale" not in schema["required"], schema
        assert schema["properties"]["scale"]["description"].startswith("laplace-voting:")
        assert schema["properties"]["sigma"]["description"].startswith("voting:")
        assert dbg["noisy_votes"].keys() == {"Yes", "No"}, dbg

        r = c.post("/v1/generate", json={"context_id": cid, "query": canary},
                   headers=user_headers())
        assert r.status_code == 422 and "'laplace-voting'" in r.text, r.text
        r = c.post("/v1/chat/completions", headers=user_headers(),
                   json={"model": cid, "messages": [{"role": "user", "content": canary}]})
        assert r.status_code == 200, r.text
        assert r.json()["dpicl"]["mechanism"] == "laplace-voting"

        answered = 3
        while True:
            r = c.post("/v1/classify", json={"context_id": cid, "query": canary},
                       headers=user_headers())
            if r.status_code != 200:
                break
            answered += 1
        assert r.json()["error"]["code"] == "budget_exhausted", r.text
        assert answered == left, (answered, left)
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["spent_epsilon"] <= 20.0, info
    print("served")
    """
)


def test_a_mechanism_installed_from_outside_is_discovered_and_served(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE, site / "laplace_voting")
    dist = site / "laplace_voting-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: laplace-voting\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[dpicl.mechanisms]\nlaplace-voting = laplace_voting.server:LAPLACE_VOTING\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *sys.path])
    script = f"TMP = __import__('pathlib').Path({str(tmp_path / 'db')!r})\n" + SCRIPT
    (tmp_path / "db").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "served" in out.stdout
