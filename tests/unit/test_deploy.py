"""deploy/: the kustomize base and the example overlay render, and the rendered objects hold
together: probes and ports, the GPU DaemonSet and its executor arguments, Secrets that exist
wherever they are named and appear nowhere else, the ServiceMonitor, labels, namespaces and
security contexts.

Renders with the kustomize that ``make kustomize`` builds (pinned in the Makefile; ``make test``
builds it first). Without it the tests fail and say so; without Go, which builds it, they skip.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from executor.command import _parser as executor_parser

pytestmark = pytest.mark.subprocess  # every test renders deploy/ with the kustomize binary

ROOT = Path(__file__).resolve().parents[2]
SECRET_NAMES = {"slicesched-admin", "slicesched-neo4j", "slicesched-executor"}
SECRET_FILES = {"admin.env": "admin-key", "neo4j.env": "password", "executor.env": "key"}
GPU = "nvidia.com/gpu"

Obj = dict[str, Any]


def kustomize() -> Path:
    version = re.search(r"^KUSTOMIZE_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version, "the Makefile pins KUSTOMIZE_VERSION"
    cache = Path(os.environ.get("SLICESCHED_CACHE") or Path.home() / ".cache/slicesched")
    binary = cache / "tools" / f"kustomize-{version.group(1)}" / "kustomize"
    if not binary.is_file():
        if shutil.which("go") is None:
            pytest.skip("Go is not installed, so `make kustomize` cannot build kustomize: deploy/ is not rendered")
        pytest.fail(f"kustomize {version.group(1)} is not installed at {binary}: run `make kustomize` "
                    "(make test does it first)")
    return binary


def build(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kustomize()), "build", str(path)], capture_output=True, text=True, timeout=60)


def render(path: Path) -> list[Obj]:
    done = build(path)
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def copy_deploy(tmp: Path) -> Path:
    """deploy/ under ``tmp`` without any secrets files a developer keeps in this clone."""
    shutil.copytree(ROOT / "deploy", tmp / "deploy", ignore=shutil.ignore_patterns("*.env"))
    return tmp / "deploy"


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render(ROOT / "deploy" / "base")


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Obj], set[str]]:
    """The example overlay rendered with fresh secrets files; the objects and the secret values."""
    deploy = copy_deploy(tmp_path_factory.mktemp("overlay"))
    values = set()
    for name in SECRET_FILES:
        example = (deploy / "overlays/example/secrets" / f"{name}.example").read_text()
        lines = []
        for line in example.splitlines():
            if line and not line.startswith("#"):
                value = f"v{secrets.token_hex(16)}"
                values.add(value)
                line = f"{line.partition('=')[0]}={value}"
            lines.append(line)
        (deploy / "overlays/example/secrets" / name).write_text("\n".join(lines) + "\n")
    return render(deploy / "overlays/example"), values


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def pod_specs(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet"):
            yield o, o["spec"]["template"]["spec"]


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """``args`` with ``$(NAME)`` replaced as the kubelet does (a missing name is a KeyError here)."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def both(base: list[Obj], overlay: tuple[list[Obj], set[str]]) -> list[list[Obj]]:
    return [base, overlay[0]]


# ---- what renders --------------------------------------------------------------------------------
def test_the_base_renders_every_part_and_names_but_holds_no_secret(base: list[Obj]) -> None:
    assert sorted(o["kind"] for o in base) == sorted(["Namespace", "ConfigMap", "Deployment", "Service", "Service",
                                                      "DaemonSet", "NetworkPolicy", "ServiceMonitor", "PersistentVolumeClaim"])
    named = {e["valueFrom"]["secretKeyRef"]["name"] for _, spec in pod_specs(base) for c in spec["containers"]
             for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    assert named == SECRET_NAMES  # made by an overlay, from files outside git


def test_the_example_overlay_refuses_to_render_without_its_secrets_files(tmp_path: Path) -> None:
    done = build(copy_deploy(tmp_path) / "overlays/example")
    assert done.returncode != 0 and "secrets/admin.env" in done.stderr  # no default keys, ever


def test_the_overlay_adds_the_secrets_and_its_own_settings(overlay: tuple[list[Obj], set[str]]) -> None:
    objs, _ = overlay
    assert {o["metadata"]["name"].rsplit("-", 1)[0] for o in objs if o["kind"] == "Secret"} == SECRET_NAMES
    config = one(objs, "ConfigMap")["data"]
    assert config["SLICESCHED_NEO4J_URI"].startswith("neo4j+s://") and config["SLICESCHED_PLACEMENT"] == "replica"
    assert config["SLICESCHED_COST_MODEL"] == "roofline"  # from the base: the image carries no trained artifact
    assert {c["image"] for _, spec in pod_specs(objs) for c in spec["containers"]} == {
        "registry.example.com/slicesched:0.1.0"}


# ---- the service ---------------------------------------------------------------------------------
def test_the_service_is_a_leader_and_a_standby_with_probes_on_readyz_and_healthz(
        base: list[Obj], overlay: tuple[list[Obj], set[str]]) -> None:
    for objs in both(base, overlay):
        deployment = one(objs, "Deployment", "slicesched")
        assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
        config = one(objs, "ConfigMap")["data"]
        assert config["SLICESCHED_LEADER_ELECTION"] == "1"  # else two pods would grant the same work twice
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        assert c["command"] == ["slicesched"] and c["args"] == ["serve", "--host", "0.0.0.0", "--port", "8000"]
        assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        services = {s["metadata"]["name"]: s for s in objs if s["kind"] == "Service"}
        assert set(services) == {"slicesched", "slicesched-executor-api"}
        for service in services.values():
            assert selects(service["spec"]["selector"], pod_labels)
            assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
        # clients see the pod only while it is ready; executors reach it while Neo4j is away too
        assert services["slicesched-executor-api"]["spec"]["publishNotReadyAddresses"] is True
        assert not services["slicesched"]["spec"].get("publishNotReadyAddresses")


# ---- the executors -------------------------------------------------------------------------------
def test_executors_are_one_daemon_per_gpu_node_with_every_gpu(base: list[Obj],
                                                            overlay: tuple[list[Obj], set[str]]) -> None:
    for objs, gpus in ((base, 8), (overlay[0], 4)):
        daemonset = one(objs, "DaemonSet", "slicesched-executor")
        spec = daemonset["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert c["resources"]["limits"][GPU] == gpus and GPU not in c["resources"].get("requests", {})
        assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
        assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        env = env_of(c)
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        ref = env["SLICESCHED_SERVER"]["valueFrom"]["configMapKeyRef"]
        server = one(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
        assert server == "http://slicesched-executor-api:8000"  # the Service above, ready or not
        # the real command line parser accepts the arguments once Kubernetes has expanded them
        assert c["command"] == ["slicesched"] and c["args"][0] == "executor"
        expanded = expand(c["args"][1:], {"SLICESCHED_SERVER": server, "NODE_NAME": "gpu-node-7", "POD_IP": "10.1.2.3"})
        args = executor_parser().parse_args(expanded)
        assert (args.server, args.devices, args.executor_id, args.host_id) == (server, "auto", "gpu-node-7", "gpu-node-7")
        assert (args.stage_host, args.stage_port) == ("10.1.2.3", 8100)
        assert c["ports"] == [{"name": "stage", "containerPort": 8100, "protocol": "TCP"}]
        policy = one(objs, "NetworkPolicy")  # the stage server has no key: only executors reach it
        pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
        assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
        (rule,) = policy["spec"]["ingress"]
        assert [selects(f["podSelector"]["matchLabels"], pod_labels) for f in rule["from"]] == [True]
        assert rule["ports"] == [{"port": "stage", "protocol": "TCP"}]


def test_the_service_and_every_executor_read_models_from_disk_at_the_same_path(base: list[Obj]) -> None:
    """A model from disk is registered by its path: the service (config, tokenizer) and each
    executor (weights) mount the same read-only claim at /models."""
    claim = one(base, "PersistentVolumeClaim", "slicesched-models")
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    for kind, name in (("Deployment", "slicesched"), ("DaemonSet", "slicesched-executor")):
        spec = one(base, kind, name)["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": "slicesched-models", "readOnly": True}


# ---- secrets and configuration -------------------------------------------------------------------
def test_every_secret_and_config_named_exists_and_no_secret_value_leaks(
        overlay: tuple[list[Obj], set[str]]) -> None:
    objs, values = overlay
    data = {(o["kind"], o["metadata"]["name"]): o.get("data", {}) for o in objs if o["kind"] in ("Secret", "ConfigMap")}
    refs = []
    for _, spec in pod_specs(objs):
        for c in spec["containers"]:
            for e in c.get("env", []):
                source = e.get("valueFrom", {})
                assert "value" not in e or not re.search(r"KEY|PASSWORD|TOKEN", e["name"]), e  # never a literal
                for field, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                    if field in source:
                        refs.append((kind, source[field]["name"], source[field]["key"], source[field].get("optional")))
            refs += [("ConfigMap", f["configMapRef"]["name"], None, False) for f in c.get("envFrom", [])]
    monitor_credentials = one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["authorization"]["credentials"]
    refs.append(("Secret", monitor_credentials["name"], monitor_credentials["key"], False))
    assert {r[1].rsplit("-", 1)[0] for r in refs if r[0] == "Secret"} == SECRET_NAMES
    for kind, name, key, optional in refs:
        assert (kind, name) in data, f"{kind} {name} is named but not rendered"
        assert key is None or key in data[(kind, name)] or optional, f"{kind} {name} has no key {key}"
    for o in objs:
        if o["kind"] != "Secret":
            text = yaml.safe_dump(o)
            assert not [v for v in values if v in text], f"a secret value in {o['kind']} {o['metadata']['name']}"


# ---- monitoring ----------------------------------------------------------------------------------
def test_the_service_monitor_scrapes_the_service_once_with_the_admin_key(base: list[Obj],
                                                                       overlay: tuple[list[Obj], set[str]]) -> None:
    for objs in both(base, overlay):
        monitor = one(objs, "ServiceMonitor")
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        scraped = [s for s in objs if s["kind"] == "Service"
                   and selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert [s["metadata"]["name"] for s in scraped] == ["slicesched"]  # not its executor-facing twin too
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in scraped[0]["spec"]["ports"]}
        assert endpoint["path"] == "/metrics" and endpoint["authorization"]["type"] == "Bearer"
        (c,) = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
        assert endpoint["authorization"]["credentials"] == env_of(c)["SLICESCHED_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    assert one(overlay[0], "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"


# ---- labels, namespaces, security ----------------------------------------------------------------
def test_labels_and_namespaces_are_consistent(base: list[Obj], overlay: tuple[list[Obj], set[str]]) -> None:
    for objs, namespace in ((base, "slicesched"), (overlay[0], "llm-serving")):
        assert one(objs, "Namespace")["metadata"]["name"] == namespace
        for o in objs:
            meta = o["metadata"]
            assert meta["labels"]["app.kubernetes.io/part-of"] == "slicesched", o["kind"]
            assert o["kind"] == "Namespace" or meta["namespace"] == namespace, (o["kind"], meta["name"])
        for workload, _ in pod_specs(objs):
            template = workload["spec"]["template"]["metadata"]["labels"]
            assert selects(workload["spec"]["selector"]["matchLabels"], template)
            assert selects(template, workload["metadata"]["labels"])


def test_pods_run_non_root_read_only_without_capabilities_within_limits(
        base: list[Obj], overlay: tuple[list[Obj], set[str]]) -> None:
    for objs in both(base, overlay):
        assert one(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        for workload, spec in pod_specs(objs):
            assert spec["automountServiceAccountToken"] is False
            assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            mounts = set()
            for c in spec["containers"]:
                sc = c["securityContext"]
                assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]) == (
                    True, False, {"drop": ["ALL"]}), workload["metadata"]["name"]
                for part in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c["resources"][part]), (workload["metadata"]["name"], part)
                assert env_of(c)["HOME"]["value"] == "/tmp"  # the one writable place
                mounts |= {m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/tmp"}
            assert {v["name"] for v in spec["volumes"] if "emptyDir" in v} >= mounts == {"tmp"}
