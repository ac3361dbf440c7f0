"""deploy/kubernetes/, validated without a cluster: every resource against the Kubernetes
API schemas that ship inside the pinned kubernetes-validate wheel (strict: no unknown field;
offline), except the two custom kinds it has no schema for (the Prometheus Operator's
ServiceMonitor and kustomize's Kustomization), which are checked field by field here; then
what a deployer relies on: probes, GPUs, secrets that exist, the router's configuration
equal to deploy/haproxy/haproxy.cfg, the migration Job, pinned images."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dpicl.config import Settings

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
#: Custom resources: no schema in kubernetes-validate (checked by hand below).
CUSTOM = {"ServiceMonitor", "Kustomization"}


def resources() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    for _, doc in resources():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name}")


@pytest.mark.parametrize(
    ("file", "doc"),
    [r for r in resources() if r[1]["kind"] not in CUSTOM],
    ids=lambda v: v if isinstance(v, str) else f"{v['kind']}/{v['metadata']['name']}",
)
def test_resource_matches_the_kubernetes_schema(file: str, doc: dict[str, Any]) -> None:
    version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(doc, version, strict=True)  # raises on any error


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kust["resources"]) == sorted(files)


def test_server_deployment_probes_gpus_and_settings() -> None:
    dep = find("Deployment", "dpicl-server")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert c["startupProbe"]["httpGet"]["path"] == "/livez"  # model loading takes minutes
    env = {e["name"]: e.get("value") for e in c["env"]}
    gpus = int(env["DPICL_VLLM_TENSOR_PARALLEL_SIZE"]) * int(env["DPICL_VLLM_DATA_PARALLEL_SIZE"])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert env["DPICL_ENGINE"] == "vllm" and env["DPICL_WHITEBOX"] == "off"
    assert env["DPICL_LOG_FORMAT"] == "json" and env["DPICL_METRICS"] == "admin"
    for name in env:
        assert name.removeprefix("DPICL_").lower() in Settings.model_fields, name
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The headless Service the router discovers the ready pods through.
    svc = find("Service", "dpicl-server")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]


def test_secrets_referenced_exist() -> None:
    keys = set(find("Secret", "dpicl-secrets")["stringData"])
    assert {"DPICL_ADMIN_TOKEN", "DPICL_DATABASE_URL", "POSTGRES_PASSWORD"} <= keys
    text = "".join(p.read_text() for p in K8S.glob("*.yaml"))
    for ref in re.findall(r"secretKeyRef: \{name: dpicl-secrets, key: (\w+)\}", text):
        assert ref in keys
    monitor = find("ServiceMonitor", "dpicl-server")
    assert monitor["spec"]["endpoints"][0]["bearerTokenSecret"]["key"] in keys
    # No secret value inline in a workload.
    for _, doc in resources():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    secret = re.search("TOKEN|PASSWORD|KEYS|SECRET|DATABASE_URL", e["name"])
                    assert not secret or "valueFrom" in e, e


def test_service_monitor_scrapes_the_servers() -> None:
    monitor = find("ServiceMonitor", "dpicl-server")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    svc = find("Service", "dpicl-server")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_router_uses_the_project_configuration() -> None:
    config = find("ConfigMap", "dpicl-router")["data"]["haproxy.cfg"]
    assert config == (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text(), (
        "router.yaml's ConfigMap must be a copy of deploy/haproxy/haproxy.cfg"
    )
    (c,) = find("Deployment", "dpicl-router")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    host, port = env["ROUTER_SERVERS"].rsplit(":", 1)
    # A fully qualified name of the headless Service (HAProxy applies no search domain).
    assert host == "dpicl-server.dpicl.svc.cluster.local" and port == "8000"
    assert c["ports"][0]["containerPort"] == int(env["ROUTER_PORT"])


def test_migration_job_and_database_option() -> None:
    job = find("Job", "dpicl-migrate")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["dpicl", "migrate"]
    assert c["envFrom"] == [{"secretRef": {"name": "dpicl-secrets"}}]
    server = find("Deployment", "dpicl-server")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == server["image"]  # the migration of the release being rolled out
    sts = find("StatefulSet", "dpicl-postgres")
    assert sts["spec"]["volumeClaimTemplates"]
    # The external-database option: the Secret's URL is all that names the database.
    assert "external" in (K8S / "secret.yaml").read_text()


def test_images_are_pinned() -> None:
    for _, doc in resources():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            repo, _, tag = c["image"].rpartition(":")
            assert repo and tag and tag != "latest", c["image"]
