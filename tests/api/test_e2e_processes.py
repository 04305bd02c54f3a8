"""End to end with real processes on loopback: ``slicesched serve`` under uvicorn, two
``slicesched executor`` daemons running the models with PyTorch, the session's Neo4j."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from executor.batcher import generate_alone
from service.domain.model_config import model_config
from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from service.models.family import build_model
from tests.api.test_metrics import Scrape, check_done_requests

TENANTS = (("acme", "tiny"), ("globex", "tiny-llama"), ("initech", "tiny"))


@pytest.fixture
def stack(neo4j: Neo4jSettings) -> Iterator[LiveStack]:
    with LiveStack(neo4j=neo4j, lease_ttl_s=2.0, heartbeat_s=0.4) as s:
        yield s


def setup(stack: LiveStack, c: httpx.Client) -> None:
    for tenant, family in TENANTS:
        assert c.post("/v1/tenants", json={"tenant_id": tenant}).status_code == 201
        r = c.post("/v1/catalog/models", json={"model_id": "m", "family": family, "tenant_id": tenant})
        assert r.status_code == 201, r.text
    stack.start_executor("ea", ["cpu:0", "cpu:1"])
    stack.start_executor("eb", ["cpu:0", "cpu:1"])
    stack.wait_devices(4)


def submit(c: httpx.Client, n: int, max_tokens: int) -> dict[str, tuple[str, str]]:
    ids = {}
    for i in range(n):
        tenant = TENANTS[i % len(TENANTS)][0]
        prompt = f"request {i} of {tenant}"
        r = c.post("/v1/requests", json={"model_id": "m", "prompt": prompt, "max_tokens": max_tokens, "tenant_id": tenant})
        assert r.status_code == 202, r.text
        ids[r.json()["request_id"]] = (tenant, prompt)
    return ids


def wait_done(c: httpx.Client, ids: dict[str, Any], timeout_s: float = 120.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = [c.get(f"/v1/requests/{rid}").json() for rid in ids]
            if all(g["status"] == "done" for g in got):
                return got
        except httpx.HTTPError:
            pass  # the service is restarting
        assert time.monotonic() < deadline, "requests did not finish"
        time.sleep(0.3)


def check_tokens(c: httpx.Client, got: list[dict[str, Any]], ids: dict[str, tuple[str, str]], max_tokens: int) -> None:
    """Every result equals the same model (same seed) run directly in this process."""
    family = dict(TENANTS)
    models = {}
    for tenant, _ in TENANTS:
        seed = c.get("/v1/catalog/models/m", params={"tenant_id": tenant}).json()["seed"]
        models[tenant] = build_model(model_config(family[tenant]), seed=seed)
    for g in got:
        tenant, prompt = ids[g["request_id"]]
        assert g["output_tokens"] == generate_alone(models[tenant], list(prompt.encode()), max_tokens), g["request_id"]


def served_once(stack: LiveStack, c: httpx.Client, ids: dict[str, Any]) -> None:
    """In the GMG every request is done and served by exactly one completed slice (the writer
    batches: give it a few seconds to catch up)."""
    query = ("MATCH (r:Request) WHERE r.uid IN $ids OPTIONAL MATCH (s:Slice {state: 'done'})-[:SERVES]->(r) "
             "RETURN r.uid, r.status, count(s)")
    want = sorted([rid, "done", 1] for rid in ids)
    deadline = time.monotonic() + 10
    while True:
        rows = sorted(c.post("/v1/inspect", json={"query": query, "params": {"ids": list(ids)}}).json()["rows"])
        if rows == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows == want


def observations_close_the_loop(c: httpx.Client, ids: dict[str, tuple[str, str]]) -> None:
    """Every request's prefill and one of its decode iterations reached the GMG as slice
    observations (one per stage its executor timed: the device, the layers, the prompt's tokens
    or the decode's batch and cached context, the measured latency), and the cost model's
    trainer turns each into a training sample."""
    from learned.observations import ObservedSlice, observation_samples
    from service.live.retraining import trace_observed

    query = ("MATCH (s:Slice) WHERE s.latency_s IS NOT NULL AND s.tenant_id IN $tenants "
             "MATCH (d:Device {device_id: s.observed_device_id}) "
             "RETURN s.uid AS uid, s.family AS family, d.kind AS device_kind, s.layer_start AS layer_start, "
             "s.layer_end AS layer_end, s.batch AS batch, s.tokens AS tokens, s.phase AS phase, "
             "s.context AS context, s.latency_s AS latency_s, s.observed_wall AS observed_wall, "
             "s.tenant_id AS tenant")
    tenants = [t for t, _ in TENANTS]
    deadline = time.monotonic() + 15
    while True:  # soft state: the GMG writer batches
        out = c.post("/v1/inspect", json={"query": query, "params": {"tenants": tenants}}).json()
        rows = [dict(zip(out["columns"], r, strict=True)) for r in out["rows"]]
        leases = {phase: {str(r["uid"]).split("/")[0] for r in rows if r["phase"] == phase}
                  for phase in ("prefill", "decode")}
        if min(len(x) for x in leases.values()) >= len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    for phase, observed in leases.items():
        assert len(observed) == len(ids), f"{len(observed)} of {len(ids)} requests' {phase} observed"
    prompts = {tenant: {len(p.encode()) for t, p in ids.values() if t == tenant} for tenant in tenants}
    for r in rows:
        assert r["latency_s"] > 0 and r["device_kind"] == "cpu" and 0 <= r["layer_start"] < r["layer_end"] <= 2
        if r["phase"] == "prefill":
            assert r["batch"] == 1 and r["tokens"] in prompts[r["tenant"]] and r["context"] == 0
        else:  # a decode step: one new token per sequence over at least its prompt
            assert r["tokens"] == r["batch"] >= 1 and r["context"] >= min(prompts[r["tenant"]])
    samples = observation_samples([ObservedSlice.from_row(r) for r in rows], trace_observed)
    assert len(samples) == len(rows)


def test_three_tenants_complete_with_the_same_tokens_as_in_process(stack: LiveStack) -> None:
    with stack.client() as c:
        setup(stack, c)
        ids = submit(c, 12, 16)
        got = wait_done(c, ids)
        check_tokens(c, got, ids, 16)
        served_once(stack, c, ids)
        m = Scrape(c.get("/metrics").text)  # the live values: what the requests report
        assert m.value("slicesched:leases_total", event="completed") == 12
        check_done_requests(m, got)
        for r in c.get("/v1/stats").json()["replicas"]:  # homes: a replica over two devices runs as two slices
            if r["draining"]:
                continue
            kind = "slice" if len(r["devices"]) > 1 else "replica"
            assert m.value("slicesched:placements_applied_total", policy="container", action="add", kind=kind) >= 1
            assert m.value("slicesched:slices_planned", model_name="m", tenant=r["model"].split("/")[0]) >= len(r["devices"])
        observations_close_the_loop(c, ids)
        # the GMG writer flushes on its own interval: its lag histogram has a sample once it has
        # committed a change, which may come after the requests are done (wait for it, bounded)
        deadline = time.monotonic() + 30
        while Scrape(c.get("/metrics").text).value("slicesched:gmg_write_lag_seconds_count") == 0:
            assert time.monotonic() < deadline, "the GMG writer committed nothing in 30 s"
            time.sleep(0.2)


def test_killed_executor_leases_are_replaced_exactly_once(stack: LiveStack) -> None:
    with stack.client() as c:
        setup(stack, c)
        ids = submit(c, 24, 120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # kill when "ea" holds leases
            replicas = c.get("/v1/stats").json()["replicas"]
            if any(r["leases"] > 0 and r["devices"][0].startswith("ea/") for r in replicas):
                break
            time.sleep(0.05)
        assert stack.stop_executor("ea", kill=True) == -9
        got = wait_done(c, ids)
        check_tokens(c, got, ids, 120)
        stats = c.get("/v1/stats").json()
        assert stats["counters"]["leases_expired"] >= 1
        assert any(g["attempts"] >= 2 for g in got)
        served_once(stack, c, ids)


def test_service_restart_loses_no_accepted_request(stack: LiveStack) -> None:
    with stack.client() as c:
        setup(stack, c)
        ids = submit(c, 18, 80)
        time.sleep(0.3)
        stack.restart_server(kill=True)  # kill -9: whatever was only in memory is gone
        got = wait_done(c, ids)
        check_tokens(c, got, ids, 80)
        served_once(stack, c, ids)


def test_a_replica_across_two_executors_moves_activations_over_http(stack: LiveStack) -> None:
    with stack.client() as c:
        setup(stack, c)
        r = c.post("/v1/replicas", json={"tenant_id": "acme", "model_id": "m", "device_ids": ["ea/cpu:1", "eb/cpu:1"]})
        assert r.status_code == 201, r.text
        stages = r.json()["stages"]
        assert stages[0]["layers"] == [0, 1] and "url" not in stages[0]
        assert stages[1]["layers"] == [1, 2] and stages[1]["url"].startswith("http://127.0.0.1:")
        ids = {}
        for i in range(10):
            prompt = f"split {i}"
            rid = c.post("/v1/requests", json={"model_id": "m", "prompt": prompt, "max_tokens": 12,
                                               "tenant_id": "acme"}).json()["request_id"]
            ids[rid] = ("acme", prompt)
        got = wait_done(c, ids)
        check_tokens(c, got, ids, 12)
        query = ("MATCH (s:Slice {state: 'done', model_uid: 'acme/m'})-[:ON]->(d:Device {device_id: 'eb/cpu:1'}) "
                 "MATCH (s)-[:ON]->(first:Device {device_id: 'ea/cpu:1'}) RETURN count(DISTINCT s)")
        deadline = time.monotonic() + 10
        while True:  # the GMG writer batches
            split = c.post("/v1/inspect", json={"query": query}).json()["rows"][0][0]
            if split > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert split > 0, "no request ran on the replica split over both executors"
        bad = c.post("/v1/replicas", json={"tenant_id": "acme", "model_id": "m", "device_ids": ["ea/cpu:1", "nope"]})
        assert bad.status_code == 400


def test_a_standby_takes_over_after_the_leaders_kill_9_with_nothing_lost_or_run_twice(neo4j: Neo4jSettings) -> None:
    """Leader election (service/live/leader.py) with real processes: the leader is killed with
    SIGKILL while requests are in flight; the standby takes over within 10 s (a 2 s term), the
    executors follow it (given both addresses), and every request is done once with the same
    tokens as in this process."""
    from neo4j import GraphDatabase

    with GraphDatabase.driver(neo4j.uri, auth=neo4j.auth) as driver, driver.session() as s:
        s.run("MATCH (l:Leader) DETACH DELETE l").consume()  # no term left over from another test
    with LiveStack(neo4j=neo4j, lease_ttl_s=2.0, heartbeat_s=0.4, leader_ttl_s=2.0) as stack:
        stack.start_standby()
        assert httpx.get(f"http://127.0.0.1:{stack.standby_port}/readyz").json()["leadership"]["role"] == "standby"
        with stack.client() as c:
            setup(stack, c)  # the executors get both addresses
            ids = submit(c, 12, 48)
        stack.stop_server(kill=True)
        killed = time.monotonic()
        stack.promote_standby()
        deadline = killed + 30
        while True:
            try:
                if httpx.get(f"{stack.url}/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the standby did not take over"
            time.sleep(0.05)
        took_s = time.monotonic() - killed
        assert took_s <= 10.0, f"took over in {took_s:.1f} s"
        with stack.client() as c:
            assert c.get("/readyz").json()["leadership"]["role"] == "leader"
            got = wait_done(c, ids)
            check_tokens(c, got, ids, 48)
            served_once(stack, c, ids)
