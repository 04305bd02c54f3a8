"""A live lease in the GMG (in-process app, real Neo4j): granted through the real lease path it is
a running Slice whose window (epoch seconds) makes its device busy for the candidate-slot search
(and for the scheduler's search, in mirror seconds); completed, its window is the real one and the device is free; the device_timeline inspection
shows it to its tenant and nothing to another."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from service.core.slot import SlotQuery
from service.live.view import LIVE_CLUSTER, LiveClusterView
from tests.api.conftest import ADMIN, EXECUTOR, auth, new_tenant
from tests.api.test_api import completion, poll, register, setup_tenant_model


def busy_windows(repo: Any, device: str) -> list[tuple[float, float]]:
    rows = repo.inspection.run_read("MATCH (d:Device {device_id: $d}) RETURN d.busy_start_s, d.busy_end_s", {"d": device}).rows
    return list(zip(*(r or [] for r in rows[0]), strict=True)) if rows else []


def offered_at(repo: Any, tenant: str, device: str, now_s: float) -> float | None:
    """When the slot search offers ``device`` for a 50 ms slice not before ``now_s`` (epoch s)."""
    q = SlotQuery(LIVE_CLUSTER, tenant, f"{tenant}/m", now_s, {"cpu": 0.05}, slice_bytes=0, k=64)
    return {s.device_id: s.start_s for s in repo.slots.find_candidate_slots(q)}.get(device)


def test_a_live_lease_makes_its_device_busy_until_it_completes(make_client: Callable[..., TestClient], repo: Any,
                                                              uid: str) -> None:
    client = make_client(lease_ttl_s=30.0)  # no heartbeats here: the lease must outlive the test's queries
    tenant, executor = f"lb{uid}", f"lb{uid}e"
    key = setup_tenant_model(client, tenant)
    register(client, executor)
    device = f"{executor}/cpu:0"
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 2},
                      headers=auth(key)).json()["request_id"]
    before = time.time()
    assert offered_at(repo, tenant, device, before) == before  # idle: free now
    [lease] = [x for x in poll(client, executor) if x["request_id"] == rid]
    granted = time.time()
    deadline = time.monotonic() + 10
    while not busy_windows(repo, device):  # the lease reaches the GMG with the writer's next batch
        assert time.monotonic() < deadline, "the running lease never made its device busy"
        time.sleep(0.1)
    [(start, end)] = busy_windows(repo, device)
    # from its grant to its expected end: nothing measured yet, so the lease's TTL
    assert before <= start <= granted and end == start + 30.0
    assert offered_at(repo, tenant, device, start) == end  # no window overlapping the lease
    assert offered_at(repo, tenant, device, start - 0.01) == end  # a 50 ms slice does not fit before it
    assert offered_at(repo, tenant, device, end) == end
    # the scheduler's own search asks in mirror seconds: the lease's end, translated
    svc = client.app.state.service  # type: ignore[attr-defined]
    view = LiveClusterView(svc.loop.snapshot(), cost_model=svc.cost_model)
    q = SlotQuery(LIVE_CLUSTER, tenant, f"{tenant}/m", view.now_s, {"cpu": 0.05}, slice_bytes=0, k=8)
    [slot] = [s for s in svc.loop.cypher_slots(view, q) if s.device_id == executor]
    assert abs(slot.start_s - (end - view.snap.window_start_wall)) < 1e-6 and slot.start_s > view.now_s

    r = client.post("/v1/leases/complete", json={"executor_id": executor, "results": [completion(lease)]},
                    headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [lease["lease_id"]]
    finished = time.time()
    assert busy_windows(repo, device) == []  # written with the completion, before the answer
    assert offered_at(repo, tenant, device, start) == start
    [[state, s, e, start_wall, end_wall]] = repo.inspection.run_read(
        "MATCH (s:Slice {uid: $u}) RETURN s.state, s.start_s, s.end_s, s.start_wall, s.end_wall",
        {"u": lease["lease_id"]}).rows
    assert state == "done" and (s, e) == (start_wall, end_wall) == (start, e) and granted <= e <= finished

    # the device's timeline: the tenant sees its slice; another tenant, with nothing there, sees nothing
    body = {"name": "device_timeline", "params": {"device_id": device, "since_s": before - 1}}
    mine = client.post("/v1/inspect", json=body, headers=auth(key)).json()
    assert mine["rows"] == [[lease["lease_id"], tenant, f"{tenant}/m", "done", start, e, 0]]
    stranger = new_tenant(client, f"ls{uid}")
    assert client.post("/v1/inspect", json=body, headers=auth(stranger)).json()["rows"] == []
    admin = {"name": "device_timeline", "params": {**body["params"], "tenant_id": None}}
    assert client.post("/v1/inspect", json=admin, headers=auth(ADMIN)).json()["rows"] == mine["rows"]
