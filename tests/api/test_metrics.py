"""``/metrics`` after real traffic (in-process app on the real Neo4j, the test as the executor so
every time is known): vLLM's names with the ``slicesched:`` prefix, their types and labels, and
values equal to what the requests reported; the scheduler's metrics; and every metric the
Grafana dashboard's PromQL names exists in the output."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.api.conftest import ADMIN, EXECUTOR, auth
from tests.api.test_api import poll, register, setup_tenant_model

DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "dashboards" / "slicesched.json"
REQUEST_LABELS = {"model_name", "tenant"}


class Scrape:
    """One ``/metrics`` answer, parsed with prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def type(self, family: str) -> str:
        return str(self.families[family].type)

    def value(self, name: str, **labels: str) -> float:
        """The sample ``name`` whose labels include ``labels`` (exactly one), or 0 when none has
        been observed (a labelled series appears at its first observation); the name itself
        must be in the output."""
        assert name in self.names(), name
        found = [s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items()]
        assert len(found) <= 1, (name, labels, found)
        return float(found[0]) if found else 0.0

    def names(self) -> set[str]:
        """Every sample name the output declares or carries (a histogram declared without a
        series yet still names its _bucket, _sum and _count)."""
        suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}
        declared = {f.name + sfx for f in self.families.values() for sfx in suffixes.get(str(f.type), ("",))}
        return declared | {s.name for s in self.samples}


def scrape(client: TestClient) -> Scrape:
    r = client.get("/metrics", headers=auth(ADMIN))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return Scrape(r.text)


def submit(client: TestClient, key: str, **body: Any) -> str:
    r = client.post("/v1/requests", json={"model_id": "m", **body}, headers=auth(key))
    assert r.status_code == 202, r.text
    return str(r.json()["request_id"])


def complete(client: TestClient, executor: str, lease: dict[str, Any], queued_s: float, ttft_s: float,
             e2e_s: float) -> None:
    body = {"lease_id": lease["lease_id"], "output_tokens": [1] * lease["max_tokens"], "queued_s": queued_s,
            "ttft_s": ttft_s, "e2e_s": e2e_s, "iterations": lease["max_tokens"], "busy_s": 0.01}
    r = client.post("/v1/leases/complete", json={"executor_id": executor, "results": [body]}, headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [lease["lease_id"]], r.text


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def check_done_requests(m: Scrape, done: list[dict[str, Any]]) -> None:
    """The request metrics of each (model, tenant) equal what its done requests (their
    ``/v1/requests/{id}`` answers) report, and nothing of theirs is waiting or running."""
    by_model: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for g in done:
        assert g["status"] == "done"
        by_model.setdefault((g["model_id"], g["tenant_id"]), []).append(g)
    for (model, tenant), mine in by_model.items():
        labels = {"model_name": model, "tenant": tenant}
        for metric, field in (("time_to_first_token_seconds", "ttft_s"), ("e2e_request_latency_seconds", "e2e_s"),
                              ("request_queue_time_seconds", "queued_s")):
            assert m.value(f"slicesched:{metric}_count", **labels) == len(mine), (metric, labels)
            assert m.value(f"slicesched:{metric}_sum", **labels) == pytest.approx(sum(g[field] for g in mine))
            assert m.value(f"slicesched:{metric}_bucket", le="+Inf", **labels) == len(mine)
        gaps = sum(len(g["output_tokens"]) - 1 for g in mine)
        assert m.value("slicesched:inter_token_latency_seconds_count", **labels) == gaps
        assert m.value("slicesched:inter_token_latency_seconds_sum", **labels) == pytest.approx(
            sum(g["e2e_s"] - g["ttft_s"] for g in mine))
        assert m.value("slicesched:prompt_tokens_total", **labels) == sum(g["prompt_tokens"] for g in mine)
        assert m.value("slicesched:generation_tokens_total", **labels) == sum(len(g["output_tokens"]) for g in mine)
        assert m.value("slicesched:request_success_total", finished_reason="length", **labels) == len(mine)
        assert m.value("slicesched:num_requests_running", **labels) == 0
        assert m.value("slicesched:num_requests_waiting", **labels) == 0
        assert m.value("slicesched:kv_cache_usage_perc", **labels) == 0.0


def test_request_metrics_are_vllms_with_the_values_of_the_traffic(make_client: Callable[..., TestClient],
                                                                  uid: str) -> None:
    client = make_client(max_attempts=1, lease_ttl_s=30.0)  # no heartbeats here: leases must outlive the test
    svc = client.app.state.service  # type: ignore[attr-defined]
    a, b, executor = f"ma{uid}", f"mb{uid}", f"me{uid}"
    key_a, key_b = setup_tenant_model(client, a), setup_tenant_model(client, b)
    register(client, executor, ("cpu:0", "cpu:1"))  # container: one home device per model
    r1, r2 = submit(client, key_a, prompt="hello", max_tokens=4), submit(client, key_a, prompt="hello", max_tokens=4)
    r3 = submit(client, key_b, prompt_tokens=[1, 2, 3], max_tokens=2)
    r4 = submit(client, key_b, prompt="x", max_tokens=2)
    r5 = submit(client, key_b, prompt="yy", max_tokens=3)
    assert client.post(f"/v1/requests/{r4}/cancel", headers=auth(key_b)).status_code == 200

    m = scrape(client)
    for name, kind in (("slicesched:time_to_first_token_seconds", "histogram"),
                       ("slicesched:inter_token_latency_seconds", "histogram"),
                       ("slicesched:e2e_request_latency_seconds", "histogram"),
                       ("slicesched:request_queue_time_seconds", "histogram"),
                       ("slicesched:num_requests_running", "gauge"), ("slicesched:num_requests_waiting", "gauge"),
                       ("slicesched:kv_cache_usage_perc", "gauge"), ("slicesched:prompt_tokens", "counter"),
                       ("slicesched:generation_tokens", "counter"), ("slicesched:request_success", "counter"),
                       ("slicesched:placements_applied", "counter"), ("slicesched:slices_planned", "gauge"),
                       ("slicesched:slices_running", "gauge"), ("slicesched:whatif_duration_seconds", "histogram"),
                       ("slicesched:scheduler_step_duration_seconds", "histogram"),
                       ("slicesched:leases", "counter"), ("slicesched:gmg_write_lag_seconds", "histogram"),
                       ("slicesched:gmg_writer_queue_depth", "gauge"), ("slicesched:sla_violations", "counter")):
        assert m.type(name) == kind, name
    assert not any(s.name.startswith("slicesched_") for s in m.samples)  # one namespace: the old names are gone
    assert {s.name: set(s.labels) for s in m.samples if s.name == "slicesched:num_requests_waiting"} == \
        {"slicesched:num_requests_waiting": REQUEST_LABELS}
    assert m.value("slicesched:num_requests_waiting", model_name="m", tenant=a) == 2
    assert m.value("slicesched:num_requests_waiting", model_name="m", tenant=b) == 2  # r3, r5 (r4 cancelled)
    assert m.value("slicesched:num_requests_running", model_name="m", tenant=a) == 0
    assert m.value("slicesched:kv_cache_usage_perc", model_name="m", tenant=a) == 0.0
    assert m.value("slicesched:request_success_total", tenant=b, finished_reason="abort") == 1
    assert m.value("slicesched:requests_arrived_total", model_name="m", tenant=b) == 3
    assert m.value("slicesched:placements_applied_total", policy="container", action="add", kind="replica") == 2
    assert m.value("slicesched:slices_planned", tenant=a) == m.value("slicesched:slices_planned", tenant=b) == 1

    leases = {x["request_id"]: x for x in poll(client, executor)}
    assert sorted(leases) == sorted([r1, r2, r3, r5])
    m = scrape(client)
    reserve = svc.state.registry.kv_reserve_tokens  # one replica each: KV reserved = its reserve
    assert m.value("slicesched:num_requests_running", tenant=a) == 2
    assert m.value("slicesched:num_requests_running", tenant=b) == 2
    assert m.value("slicesched:num_requests_waiting", tenant=a) == 0
    assert m.value("slicesched:kv_cache_usage_perc", tenant=a) == 2 * (5 + 4) / reserve
    assert m.value("slicesched:kv_cache_usage_perc", tenant=b) == ((3 + 2) + (2 + 3)) / reserve
    assert m.value("slicesched:slices_running", tenant=a) == 2
    assert m.value("slicesched:leases_total", event="granted") == 4

    complete(client, executor, leases[r1], 0.1, 0.2, 0.44)  # 3 gaps of 0.08 s: meets the standard SLA
    complete(client, executor, leases[r2], 0.1, 0.2, 5.0)  # 3 gaps of 1.6 s: misses it (0.2 s between tokens)
    complete(client, executor, leases[r3], 0.0, 0.05, 0.2)
    assert client.post(f"/v1/leases/{leases[r5]['lease_id']}/fail", json={"reason": "oom"},
                       headers=auth(EXECUTOR)).status_code == 200  # its last attempt: the request fails

    got = {rid: client.get(f"/v1/requests/{rid}", headers=auth(key)).json()
           for rid, key in ((r1, key_a), (r2, key_a), (r3, key_b))}
    m = scrape(client)
    check_done_requests(m, list(got.values()))
    assert m.value("slicesched:inter_token_latency_seconds_bucket", le="0.1", tenant=a) == 3  # r1's gaps
    assert m.value("slicesched:inter_token_latency_seconds_bucket", le="1.0", tenant=a) == 3
    assert m.value("slicesched:inter_token_latency_seconds_bucket", le="2.5", tenant=a) == 6  # and r2's
    assert m.value("slicesched:time_to_first_token_seconds_bucket", le="0.001", tenant=a) == 0
    assert m.value("slicesched:sla_violations_total", tenant=a) == 1
    assert m.value("slicesched:sla_violations_total", tenant=b) == 0
    assert m.value("slicesched:request_failure_total", model_name="m", tenant=b) == 1
    assert {(e, m.value("slicesched:leases_total", event=e)) for e in ("completed", "failed", "expired")} == \
        {("completed", 3), ("failed", 1), ("expired", 0)}

    # the scheduler's side: an admin what-if, a replica pinned over two devices (a sliced one)
    r = client.post("/v1/whatif", json={"tenant_id": a, "model_id": "m", "device_ids": [f"{executor}/cpu:1"],
                                        "horizon_s": 2}, headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    r = client.post("/v1/replicas", json={"tenant_id": a, "model_id": "m",
                                          "device_ids": [f"{executor}/cpu:0", f"{executor}/cpu:1"]}, headers=auth(ADMIN))
    assert r.status_code == 201, r.text
    wait_for(lambda: scrape(client).value("slicesched:gmg_write_lag_seconds_count") > 0)  # the writer's batch
    m = scrape(client)
    assert m.value("slicesched:whatif_duration_seconds_count", source="admin") == 1
    assert m.value("slicesched:whatif_duration_seconds_sum", source="admin") > 0
    assert m.value("slicesched:placements_applied_total", policy="admin", action="add", kind="slice") == 1
    assert m.value("slicesched:slices_planned", tenant=a) == 1 + 2
    assert m.value("slicesched:gmg_write_lag_seconds_sum") > 0 and m.value("slicesched:neo4j_up") == 1

    # every metric a dashboard panel asks for is in the output, with the labels its selectors use
    names = m.names()
    for panel, expr in dashboard_queries():
        used = re.findall(r"slicesched:[A-Za-z0-9_:]+", expr)
        assert used, (panel, expr)
        assert set(used) <= names, (panel, set(used) - names)
        for metric, selector in re.findall(r"(slicesched:[A-Za-z0-9_:]+)\{([^}]*)\}", expr):
            have = {label for s in m.samples if s.name == metric for label in s.labels}
            assert {lbl for lbl in re.findall(r"([a-z_]+)\s*[!=]~?", selector)} <= have, (panel, metric, have)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the shipped dashboard (template variables too)."""
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"${v['name']}", v["definition"]) for v in dash["templating"]["list"]]
    assert len(out) > 20
    return out


def test_scheduler_steps_are_timed(make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client(placement="replica", schedule_interval_s=0.05)
    key = setup_tenant_model(client, f"st{uid}")
    register(client, f"st{uid}e")
    submit(client, key, prompt="x", max_tokens=2)  # an arrival: the scheduler steps
    wait_for(lambda: scrape(client).value("slicesched:scheduler_step_duration_seconds_count", policy="replica") >= 1)
    m = scrape(client)
    assert m.value("slicesched:scheduler_step_duration_seconds_sum", policy="replica") > 0
    assert m.value("slicesched:placements_applied_total", policy="container", action="add", kind="replica") == 1
