"""The monitoring files in docker/ hold together (no Docker engine here: their structure is
checked instead): the compose file's `monitoring` profile, the Prometheus scrape config, Grafana's
provisioning and the dashboard. That every metric the dashboard names is in ``/metrics`` is
checked against a live app in tests/api/test_metrics.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
MONITORING = {"serve", "prometheus", "grafana"}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts: container path -> the host path (relative to docker/)."""
    out = {}
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        if source.startswith("."):
            out[target] = (DOCKER / source).resolve()
    return out


def in_container(service: dict[str, Any], path: str) -> Path:
    """The host file a container path of ``service`` shows (through its bind mounts)."""
    for target, source in mounts(service).items():
        if path == target or path.startswith(target + "/"):
            return source / path[len(target):].lstrip("/")
    raise AssertionError(f"{path} is not mounted")


def test_the_monitoring_profile_starts_the_service_prometheus_and_grafana() -> None:
    compose = load(DOCKER / "compose.yml")
    services = compose["services"]
    assert {name for name, s in services.items() if "monitoring" in s.get("profiles", [])} == MONITORING
    assert all("profiles" not in services[name] for name in ("neo4j", "slicesched"))  # the default stays as it was
    for name, s in services.items():
        for dep in s.get("depends_on", []):
            assert dep in services, (name, dep)
        for spec in s.get("volumes", []):
            source = spec.split(":")[0]
            assert source.startswith(".") or source in compose["volumes"], (name, spec)
        for source in mounts(s).values():
            assert source.exists(), (name, source)
        for secret in s.get("secrets", []):
            assert secret in compose["secrets"], (name, secret)
        if "build" in s:
            assert (DOCKER / s["build"]["context"] / s["build"]["dockerfile"]).is_file()
    assert compose["secrets"]["slicesched_admin_key"] == {"environment": "SLICESCHED_ADMIN_KEY"}
    serve = " ".join(services["serve"]["command"])
    assert "slicesched serve --host 0.0.0.0 --port 8000" in serve and "/run/secrets/slicesched_admin_key" in serve
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")


def test_prometheus_scrapes_the_service_with_the_admin_key_from_a_file() -> None:
    compose = load(DOCKER / "compose.yml")
    prometheus = compose["services"]["prometheus"]
    config_path = next(arg.split("=", 1)[1] for arg in prometheus["command"] if arg.startswith("--config.file="))
    assert in_container(prometheus, config_path) == (DOCKER / "prometheus.yml").resolve()
    config = load(DOCKER / "prometheus.yml")
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    key_file = job["authorization"]["credentials_file"]
    assert key_file.startswith("/run/secrets/") and key_file.removeprefix("/run/secrets/") in prometheus["secrets"]
    [target] = [t for sc in job["static_configs"] for t in sc["targets"]]
    host, port = target.split(":")
    assert host in compose["services"] and f"--port {port}" in " ".join(compose["services"][host]["command"])


def test_grafana_provisions_the_datasource_and_the_dashboard() -> None:
    compose = load(DOCKER / "compose.yml")
    grafana = compose["services"]["grafana"]
    provisioning = in_container(grafana, "/etc/grafana/provisioning")
    [datasource] = load(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    [provider] = load(provisioning / "dashboards" / "slicesched.yml")["providers"]
    dashboards = in_container(grafana, provider["options"]["path"])
    assert (dashboards / "slicesched.json").is_file()
    assert in_container(grafana, grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).is_file()
    dash = json.loads((dashboards / "slicesched.json").read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in panels:
        assert p["datasource"]["uid"] == datasource["uid"] and p["targets"], p["title"]
        assert all(t["expr"] and t["datasource"]["uid"] == datasource["uid"] for t in p["targets"]), p["title"]
        assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for wanted in ("histogram_quantile(0.99, sum by (le) (rate(slicesched:time_to_first_token_seconds_bucket",
                   "slicesched:inter_token_latency_seconds_bucket", "slicesched:e2e_request_latency_seconds_bucket",
                   "rate(slicesched:generation_tokens_total", "slicesched:num_requests_running",
                   "slicesched:num_requests_waiting", "slicesched:kv_cache_usage_perc", "sum by (le, tenant)",
                   "slicesched:placements_applied_total", "slicesched:slices_planned", "slicesched:slices_running",
                   "rate(slicesched:whatif_duration_seconds_count", "slicesched:whatif_duration_seconds_bucket",
                   "slicesched:gmg_write_lag_seconds_bucket", "slicesched:sla_violations_total"):
        assert wanted in exprs, wanted
    assert {v["name"] for v in dash["templating"]["list"]} == {"tenant", "model_name"}
