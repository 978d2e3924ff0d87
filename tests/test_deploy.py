"""deploy/kubernetes: each kustomization builds (kubectl kustomize) and every resource is
valid for Kubernetes (kubernetes-validate, strict); the probes, the grace period and the
configuration agree with laneway; the Dockerfile runs what the manifests expect."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from laneway.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ["base", "cluster", "vllm"]


def files_of(kustomization: str) -> list[Path]:
    """The resource files a kustomization lists (and of the kustomizations it includes)."""
    here = K8S / kustomization
    k = yaml.safe_load((here / "kustomization.yaml").read_text(encoding="utf-8"))
    out: list[Path] = []
    for r in k.get("resources", []):
        path = (here / r).resolve()
        out += files_of(str(path.relative_to(K8S))) if path.is_dir() else [path]
    return out


def built(kustomization: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is needed to build the kustomizations (Debian: kubernetes-client)"
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_resource_file_is_valid(kustomization: str) -> None:
    for path in files_of(kustomization):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                validate(doc)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_each_kustomization_builds_to_valid_resources(kustomization: str) -> None:
    docs = built(kustomization)
    assert docs
    for doc in docs:
        validate(doc)


def laneway_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    [deploy] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "laneway"]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    return deploy, cm["data"]["laneway.toml"]


@pytest.mark.parametrize(("kustomization", "replicas"), [("base", 1), ("cluster", 3)])
def test_the_laneway_deployment_fits_laneway(kustomization: str, replicas: int) -> None:
    import tomllib

    deploy, toml = laneway_of(built(kustomization))
    spec = deploy["spec"]
    assert spec["replicas"] == replicas
    config = parse_config(tomllib.loads(toml))  # the configuration it ships parses
    assert config.auth  # it listens on 0.0.0.0: keys are required
    assert config.ops_auth  # /metrics and /dashboard too
    tenants = {t.name: t for t in config.tenants}
    assert tenants["monitoring"].policy.allowed == frozenset()  # Prometheus's key runs nothing
    assert (config.cluster is not None) == (replicas > 1)
    pod = spec["template"]["spec"]
    [c] = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert config.shutdown_grace_s is not None
    assert pod["terminationGracePeriodSeconds"] > config.shutdown_grace_s  # room to end requests
    assert (
        c["command"] == ["laneway"] and c["args"][0] == "serve" and "/etc/laneway/laneway.toml" in c["args"]
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    if replicas == 1:
        assert "persistentVolumeClaim" in volumes["data"]  # SQLite, kept
        assert spec["strategy"]["type"] == "Recreate"
    else:
        assert "emptyDir" in volumes["data"] and "persistentVolumeClaim" not in volumes["data"]
        assert any(
            d["kind"] == "StatefulSet" and d["metadata"]["name"] == "redis" for d in built(kustomization)
        )


def test_the_dockerfile_runs_what_the_manifests_expect() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "torch==2.13.0" in text and "download.pytorch.org/whl/cpu" in text  # the CPU build
    assert "USER laneway" in text and "EXPOSE 8000" in text
    deploy, _ = laneway_of(built("base"))
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
    assert "--uid 10001" in text and c["ports"][0]["containerPort"] == 8000


def test_the_prometheus_configuration_scrapes_the_pods_with_the_monitoring_key() -> None:
    import yaml

    prom = ROOT / "deploy" / "prometheus"
    conf = yaml.safe_load((prom / "prometheus.yml").read_text(encoding="utf-8"))
    assert all((prom / f).is_file() for f in conf["rule_files"])
    [job] = [j for j in conf["scrape_configs"] if j["job_name"] == "laneway"]
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
    keep = {
        tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"
    }
    deploy, _ = laneway_of(built("base"))
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == labels["app.kubernetes.io/name"]
    assert keep[("__meta_kubernetes_pod_container_port_name",)] == c["ports"][0]["name"]
