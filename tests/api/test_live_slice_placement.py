"""Live placement ``slice``: a sliced guest decided by the scheduler is applied with its cut,
shown in the stats, leased to the executor of its first slice with its layers per device and
the flag that makes it yield to the owners, and its lease's Slice lands in the GMG (the real
apply, lease and write paths, on the session's Neo4j; the decision is scripted)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from service.core.scheduler import Decision, ReplicaChange, Scheduler
from service.domain.error import InvalidInputError
from service.live.settings import ServiceSettings
from tests.api.conftest import ADMIN, EXECUTOR, Scripted, auth, new_tenant

GIB = 1 << 30


def register(client: TestClient, executor_id: str, port: int) -> None:
    r = client.post("/v1/executors", headers=auth(EXECUTOR), json={
        "executor_id": executor_id, "host_id": executor_id, "stage_url": f"http://127.0.0.1:{port}",
        "devices": [{"device_id": "cpu:0", "mem_bytes": 2 * GIB}]})
    assert r.status_code == 200, r.text


def test_a_sliced_guest_is_applied_shown_and_leased_with_its_cut(make_client: Callable[..., TestClient],
                                                                  uid: str) -> None:
    client = make_client(placement="slice", schedule_interval_s=3600.0)
    a, b = f"a{uid}", f"b{uid}"
    keys = {}
    for tenant, port in ((a, 18001), (b, 18002)):
        keys[tenant] = new_tenant(client, tenant)
        r = client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(keys[tenant]))
        assert r.status_code in (200, 201), r.text
        register(client, f"e{tenant}", port)
    svc = client.app.state.service  # type: ignore[attr-defined]
    assert svc.loop.scheduler.name == "slice"  # the live slice policy: the same object as replay's
    # tenant a's layer 0 on b's executor (the lease's leader), layer 1 back on a's: owner priority
    cut = ((f"e{b}", 0, 0), (f"e{a}", 1, 1))
    svc.loop.scheduler = Scheduler(Scripted(Decision(add=[ReplicaChange(f"{a}/m", "tiny", (f"e{b}", f"e{a}"), cut)])))
    client.portal.call(svc.loop.step)  # type: ignore[union-attr]
    rid = f"{a}/m@e{b}/cpu:0:0-1+e{a}/cpu:0:1-2"
    assert svc.loop.decisions[-1] == (f"sliced: {a}/m layers 0-0 on e{b}/cpu:0, layers 1-1 on e{a}/cpu:0, "
                                 f"in {a} and {b}'s idle windows (owner priority)")
    stats = client.get("/v1/stats", headers=auth(ADMIN)).json()
    assert stats["decisions"][-1] == svc.loop.decisions[-1]
    assert stats["decision_reasons"][-1] == {  # the same line in fields
        "code": "sliced", "tenant": a, "model": f"{a}/m", "replica": f"{a}/m@e{b}/cpu:0:0-1+e{a}/cpu:0:1-2",
        "devices": [f"e{b}/cpu:0", f"e{a}/cpu:0"], "text": svc.loop.decisions[-1],
        "figures": {"plan": [[f"e{b}/cpu:0", 0, 1], [f"e{a}/cpu:0", 1, 2]], "owners": sorted([a, b]), "yields": True}}
    shown = {r["replica_id"]: r for r in client.get("/v1/stats", headers=auth(ADMIN)).json()["replicas"]}
    assert shown[rid]["guest"] and shown[rid]["yields"]
    assert shown[rid]["slices"] == [{"device": f"e{b}/cpu:0", "layers": [0, 1]},
                                    {"device": f"e{a}/cpu:0", "layers": [1, 2]}]
    for _ in range(24):
        r = client.post("/v1/requests", json={"model_id": "m", "prompt_tokens": [1, 2, 3], "max_tokens": 2},
                        headers=auth(keys[a]))
        assert r.status_code in (200, 202), r.text
    # the sliced guest takes only the overflow: nothing while the home on a's executor has room
    r = client.post("/v1/leases/poll", json={"executor_id": f"e{b}", "max_leases": 8, "wait_s": 0.0},
                    headers=auth(EXECUTOR))
    assert [x for x in r.json()["leases"] if x["replica_id"] == rid] == []
    r = client.post("/v1/leases/poll", json={"executor_id": f"e{a}", "max_leases": 64, "wait_s": 0.0},
                    headers=auth(EXECUTOR))
    assert r.json()["leases"]  # the home fills its KV slots
    r = client.post("/v1/leases/poll", json={"executor_id": f"e{b}", "max_leases": 8, "wait_s": 0.0},
                    headers=auth(EXECUTOR))
    leases = [lease for lease in r.json()["leases"] if lease["replica_id"] == rid]
    assert leases, r.json()
    lease = leases[0]
    assert lease["guest"] and lease["yields"]
    assert [(s["device_id"], s["layers"], s.get("url")) for s in lease["stages"]] == [
        ("cpu:0", [0, 1], None), ("cpu:0", [1, 2], "http://127.0.0.1:18001")]
    # its running Slice is written to the GMG on its devices (the writer batches: bounded wait)
    query = "MATCH (s:Slice {uid: $uid})-[:ON]->(d:Device) RETURN s.state, collect(d.uid)"
    deadline = time.monotonic() + 15
    while True:
        rows = client.post("/v1/inspect", json={"query": query, "params": {"uid": lease["lease_id"]}},
                           headers=auth(ADMIN)).json().get("rows")
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows and rows[0][0] == "running", rows


def test_a_replay_only_placement_is_refused_live_with_the_live_choices() -> None:
    ServiceSettings(admin_key=ADMIN, placement="slice")  # accepted
    with pytest.raises(InvalidInputError, match="live placement is container, replica or slice"):
        ServiceSettings(admin_key=ADMIN, placement="slice-fixed")


def test_the_live_slice_policy_judges_plans_from_the_cypher_slots_on_a_backlog(
        make_client: Callable[..., TestClient], uid: str) -> None:
    """The real policy on the live state: a backlogged tenant's whole-guest and sliced plans are
    judged by the what-if (their slots from the Cypher search over the GMG); whatever it
    decides is applied, and a step with a sliced guest in place runs its mirror too."""
    client = make_client(placement="slice", schedule_interval_s=3600.0)
    a, b = f"a{uid}", f"b{uid}"
    keys = {}
    for tenant, port in ((a, 18011), (b, 18012)):
        keys[tenant] = new_tenant(client, tenant)
        client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(keys[tenant]))
        register(client, f"e{tenant}", port)
    svc = client.app.state.service  # type: ignore[attr-defined]
    searched: list[int] = []
    cypher_slots = svc.loop.cypher_slots
    svc.loop.cypher_slots = lambda view, q: searched.append(1) or cypher_slots(view, q)
    judged: list[int] = []  # what-ifs of every step, the service's own loop's included (it steps on arrivals)
    step = svc.loop.scheduler.step
    svc.loop.scheduler.step = lambda now, view: (d := step(now, view), judged.append(d.num_whatifs))[0]
    for _ in range(24):
        client.post("/v1/requests", json={"model_id": "m", "prompt_tokens": list(range(1, 200)), "max_tokens": 64},
                    headers=auth(keys[a]))
    client.portal.call(svc.loop.step)  # type: ignore[union-attr]
    assert searched and sum(judged) >= 1, (judged, svc.loop.decisions)
    # a sliced guest in place (its cut in the snapshot's plans): the mirror runs it under owner priority
    applied = svc.state.apply(Decision(add=[ReplicaChange(f"{a}/m", "tiny", (f"e{b}",),
                                                          ((f"e{b}", 0, 0), (f"e{b}", 1, 1)))]),
                              {f"e{b}": (f"e{b}/cpu:0",)})
    snap = svc.loop.snapshot()
    # this one (the policy's own step above may have placed a sliced guest of its own: its choice
    # depends on the live iteration times it measured)
    (sliced,) = [r for r in snap.replicas if r.replica_id in snap.plans and r.replica_id in applied.added]
    assert sliced.yields_to_owners and [s.device_id for s in snap.plans[sliced.replica_id]] == [f"e{b}", f"e{b}"]
    client.portal.call(svc.loop.step)  # type: ignore[union-attr]
