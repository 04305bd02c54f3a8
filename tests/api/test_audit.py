"""The audit log over HTTP: an entry for each audited action with its actor, before and after,
linked to what it concerns; a placement decision with its notes and what-if figures; the chain
going on across a restart; tenants reading their own entries only; verification; auditing off."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.core.reason import DecisionReason, Status
from service.core.scheduler import Decision, ReplicaChange, Scheduler, WhatIfOutcome, WhatIfRun
from tests.api.conftest import ADMIN, EXECUTOR, Scripted, auth, new_tenant

GIB = 2**30


@pytest.fixture(autouse=True)
def empty_audit_log(repo: Any) -> Iterator[None]:
    """Each test starts from an empty audit log (one chain per graph) and leaves one."""
    def clear() -> None:
        with repo.driver.session() as s:
            s.run("MATCH (n) WHERE n:AuditEntry OR n:AuditHead DETACH DELETE n").consume()

    clear()
    yield
    clear()


def audit(client: TestClient, key: str = ADMIN, **params: Any) -> list[dict[str, Any]]:
    r = client.get("/v1/audit", params=params, headers=auth(key))
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


def one(client: TestClient, action: str, **params: Any) -> dict[str, Any]:
    """The one entry of ``action``; entries recorded in the background (a replan, a decision) may
    land a moment after the call that caused them, so this waits up to 10 s for the first."""
    deadline = time.monotonic() + 10.0
    while not (found := [e for e in audit(client, **params) if e["action"] == action]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) == 1, (action, found)
    return found[0]


def fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def register(client: TestClient, key: str, executor_id: str) -> None:
    r = client.post("/v1/executors", headers=auth(key), json={
        "executor_id": executor_id, "host_id": "h", "devices": [{"device_id": "cpu:0", "mem_bytes": 2 * GIB}]})
    assert r.status_code == 200, r.text


def concerns(repo: Any, seq: int) -> set[tuple[str, str]]:
    with repo.driver.session() as s:
        rows = s.run("MATCH (:AuditEntry {seq: $seq})-[:CONCERNS]->(n) "
                     "RETURN labels(n)[0] AS label, coalesce(n.tenant_id, n.pool_id) AS id, n.uid AS uid", seq=seq)
        return {(r["label"], r["uid"] or r["id"]) for r in rows}


def test_each_audited_action_has_its_entry(make_client: Callable[..., TestClient], repo: Any, uid: str) -> None:
    client = make_client(lease_ttl_s=60.0)  # no executor is dropped for silence here
    tenant = f"t{uid}"
    first_key = new_tenant(client, tenant)
    created = one(client, "tenant.create")
    assert (created["actor"], created["actor_role"], created["target_kind"], created["target_id"]) == \
        ("admin", "admin", "tenant", tenant)
    assert created["tenant_id"] == tenant and created["before"] is None
    assert created["after"] == {"sla_class": "standard", "weight": 1.0, "priority": 0, "key": "active",
                                "key_fingerprint": fingerprint(first_key),
                                "quota": {"tokens_per_s": None, "device_s_per_hour": None, "mem_bytes": None}}
    assert concerns(repo, created["seq"]) == {("Tenant", tenant)}

    key = client.post(f"/v1/tenants/{tenant}/keys/rotate", headers=auth(first_key)).json()["api_key"]
    rotated = one(client, "tenant.key.rotate")
    assert (rotated["actor"], rotated["actor_role"]) == (tenant, "tenant")  # the tenant rotated its own key
    assert rotated["before"]["key_fingerprint"] == fingerprint(first_key)
    assert rotated["after"]["key_fingerprint"] == fingerprint(key)
    assert key not in str(audit(client))  # fingerprints only, never a key

    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key)).status_code == 201
    model = one(client, "model.register")
    assert (model["actor"], model["target_id"], model["tenant_id"]) == (tenant, f"{tenant}/m", tenant)
    assert model["after"]["family"] == "tiny" and model["after"]["replicas"] == 1
    assert concerns(repo, model["seq"]) == {("Tenant", tenant), ("Model", f"{tenant}/m")}

    r = client.post("/v1/executor-pools", json={"pool_id": f"p{uid}", "max_devices": 4}, headers=auth(ADMIN))
    pool_key = r.json()["api_key"]
    pool = one(client, "executor_pool.create")
    assert pool["actor"] == "admin" and pool["tenant_id"] is None and pool["after"]["max_devices"] == 4
    assert concerns(repo, pool["seq"]) == {("ExecutorPool", f"p{uid}")}
    register(client, pool_key, f"e{uid}")
    registered = one(client, "executor.register")
    assert (registered["actor"], registered["actor_role"], registered["target_id"]) == (f"e{uid}", "executor", f"e{uid}")
    assert registered["before"] is None and registered["details"] == {"pool": f"p{uid}"}
    assert registered["after"]["devices"] == [{"device_id": f"e{uid}/cpu:0", "kind": "cpu", "mem_bytes": 2 * GIB}]
    replan = one(client, "placement.replan")  # the model got its home on the new device
    assert replan["actor"] == "scheduler" and replan["details"]["added"] == [f"{tenant}/m@e{uid}/cpu:0"]

    register(client, EXECUTOR, f"f{uid}")  # the bootstrap pool's key
    both = [f"e{uid}/cpu:0", f"f{uid}/cpu:0"]
    r = client.post("/v1/replicas", json={"tenant_id": tenant, "model_id": "m", "device_ids": both}, headers=auth(ADMIN))
    assert r.status_code == 201, r.text
    pinned = one(client, "replica.pin")
    assert (pinned["actor"], pinned["target_id"], pinned["after"]["device_ids"]) == ("admin", f"{tenant}/m", both)

    client.post(f"/v1/executor-pools/p{uid}/keys/rotate", headers=auth(ADMIN))
    revoked = client.post(f"/v1/executor-pools/p{uid}/keys/revoke", headers=auth(ADMIN)).json()
    entry = one(client, "executor_pool.key.revoke")
    assert entry["before"]["key"] == "active" and entry["after"] == {"key": "revoked", "key_fingerprint": None}
    assert entry["details"]["executors_dropped"] == revoked["executors_dropped"] == [f"e{uid}"]
    assert client.delete(f"/v1/executors/f{uid}", headers=auth(EXECUTOR)).status_code == 200
    gone = one(client, "executor.deregister")
    assert gone["actor"] == f"f{uid}" and gone["before"]["host_id"] == "h" and gone["after"] is None
    assert client.get(f"/v1/tenants/{tenant}", headers=auth(ADMIN)).json()["key"] == "active"
    client.post(f"/v1/tenants/{tenant}/keys/revoke", headers=auth(ADMIN))
    assert one(client, "tenant.key.revoke")["actor"] == "admin"
    assert client.get(f"/v1/tenants/{tenant}", headers=auth(ADMIN)).json()["key"] == "revoked"

    entries = audit(client)
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert entries[0]["action"] == "service.start" and entries[0]["after"]["placement"] == "container"
    assert client.get("/v1/audit/verify", headers=auth(ADMIN)).json()["ok"] is True


def test_a_silent_executor_dropped_is_audited(make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client(lease_ttl_s=0.2, heartbeat_s=0.1)
    register(client, EXECUTOR, f"e{uid}")
    deadline = time.monotonic() + 20.0
    while not audit(client, action="executor.drop"):
        assert time.monotonic() < deadline, "the silent executor was not dropped"
        time.sleep(0.1)
    dropped = one(client, "executor.drop")
    assert (dropped["actor"], dropped["actor_role"], dropped["target_id"]) == ("service", "system", f"e{uid}")
    assert dropped["details"] == {"reason": "silent for 1s"}


def test_a_placement_decision_is_audited_with_its_notes_and_what_if_figures(
        make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client(placement="replica", schedule_interval_s=3600.0)
    a, b = f"a{uid}", f"b{uid}"
    for tenant in (a, b):
        key = new_tenant(client, tenant)
        client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key))
        register(client, EXECUTOR, f"e{tenant}")
    svc = client.app.state.service  # type: ignore[attr-defined]
    change = ReplicaChange(f"{a}/m", "tiny", (f"e{b}",))
    baseline = WhatIfOutcome(20.0, 100, {f"{a}/m": 1}, 0, {})
    better = WhatIfOutcome(20.0, 160, {f"{a}/m": 0}, 0, {})
    figures = {"tokens_gain": 60, "horizon_s": 20.0, "late_before": 1, "late_after": 0, "lateness_before": 1,
               "lateness_after": 0}
    decision = Decision(add=[change], reasons=[DecisionReason("add", f"{a}/m", a, (f"e{b}",), figures=figures)],
                        num_whatifs=1, whatifs=[WhatIfRun(change, baseline, better)], status=Status("placed"))
    svc.loop.scheduler = Scheduler(Scripted(decision))
    client.portal.call(svc.loop.step)  # type: ignore[union-attr]
    client.portal.call(svc.audit.flush)  # type: ignore[union-attr]
    entry = one(client, "placement.decision")
    assert (entry["actor"], entry["actor_role"], entry["tenant_id"]) == ("scheduler", "scheduler", None)
    details = entry["details"]
    assert details["policy"] == "scripted" and details["notes"] == list(decision.notes) == [
        f"add {a}/m on e{b}: +60 tokens in 20s, 1 fewer requests late (1 -> 0), late with what follows the horizon "
        "1 -> 0, no tenant worse, no memory at risk"]
    assert details["reasons"] == [{"code": "add", "tenant": a, "model": f"{a}/m", "devices": [f"e{b}"],
                                   "figures": figures, "text": decision.notes[0]}]
    assert details["status"] == {"code": "placed", "text": "placed"}
    assert details["added"] == [f"{a}/m@e{b}/cpu:0"] and details["drained"] == []
    assert details["whatifs"] == [{"model": f"{a}/m", "compute_units": [f"e{b}"], "horizon_s": 20.0,
                                   "baseline": {"output_tokens": 100, "violations_by_model": {f"{a}/m": 1},
                                                "memory_violations": 0},
                                   "with_change": {"output_tokens": 160, "violations_by_model": {f"{a}/m": 0},
                                                   "memory_violations": 0},
                                   "gain_tokens": 60}]
    svc.loop.scheduler = Scheduler(Scripted(Decision()))  # a step that changes nothing is no entry
    client.portal.call(svc.loop.step)  # type: ignore[union-attr]
    client.portal.call(svc.audit.flush)  # type: ignore[union-attr]
    assert len(audit(client, action="placement.decision")) == 1


def test_the_chain_goes_on_across_a_restart(make_client: Callable[..., TestClient], uid: str) -> None:
    first = make_client()
    new_tenant(first, f"t{uid}")
    head = audit(first)[-1]
    first.__exit__(None, None, None)  # stopped: what it recorded is written
    second = make_client()
    new_tenant(second, f"u{uid}")
    entries = audit(second)
    assert [e["action"] for e in entries] == ["service.start", "tenant.create", "service.start", "tenant.create"]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4]
    assert entries[2]["prev_hash"] == head["hash"] and entries[2]["details"] == {"audit_head_seq": 2}
    result = second.get("/v1/audit/verify", headers=auth(ADMIN)).json()
    assert result["ok"] is True and result["entries"] == 4 and result["last_seq"] == 4


def test_a_tenant_reads_its_own_entries_only(client: TestClient, uid: str) -> None:
    a_key, b_key = new_tenant(client, f"a{uid}"), new_tenant(client, f"b{uid}")
    for key in (a_key, b_key):
        client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key))
    a_key = client.post(f"/v1/tenants/a{uid}/keys/rotate", headers=auth(a_key)).json()["api_key"]
    register(client, EXECUTOR, f"e{uid}")  # platform entries: executor, re-plan
    seen = audit(client, a_key)
    assert {e["tenant_id"] for e in seen} == {f"a{uid}"}
    assert [e["action"] for e in seen] == ["tenant.create", "model.register", "tenant.key.rotate"]
    assert f"b{uid}" not in str(seen) and f"e{uid}" not in str(seen)
    assert audit(client, a_key, tenant_id=f"a{uid}") == seen
    assert client.get("/v1/audit", params={"tenant_id": f"b{uid}"}, headers=auth(a_key)).status_code == 404
    assert audit(client, a_key, action="executor") == []
    assert client.get("/v1/audit", headers=auth(EXECUTOR)).status_code == 403
    assert client.get("/v1/audit").status_code == 401
    assert client.get("/v1/audit/verify", headers=auth(a_key)).status_code == 403
    r = client.post("/v1/inspect", headers=auth(a_key), json={"name": "audit_log", "params": {
        "tenant_id": f"b{uid}", "filters": None, "limit": 100}})
    assert r.status_code == 404  # the named query is scoped to the key's own tenant
    r = client.post("/v1/inspect", headers=auth(a_key), json={"name": "audit_log", "params": {
        "filters": {"action": "tenant"}, "limit": 100}})
    table = r.json()
    assert r.status_code == 200 and [row[table["columns"].index("action")] for row in table["rows"]] == \
        ["tenant.create", "tenant.key.rotate"]
    assert {row[table["columns"].index("tenant_id")] for row in table["rows"]} == {f"a{uid}"}
    # The admin's filters and pages.
    assert [e["action"] for e in audit(client, action="tenant.key")] == ["tenant.key.rotate"]
    assert {e["target_id"] for e in audit(client, target=f"b{uid}/m")} == {f"b{uid}/m"}
    assert {e["actor"] for e in audit(client, actor=f"a{uid}")} == {f"a{uid}"}
    everything = audit(client)
    page = client.get("/v1/audit", params={"limit": 3}, headers=auth(ADMIN)).json()
    assert page["entries"] == everything[:3] and page["next_since_seq"] == 4
    rest = audit(client, since_seq=4, until_seq=5)
    assert rest == everything[3:5]
    assert audit(client, since=everything[2]["at"], until=everything[3]["at"]) == [everything[2]]
    last = client.get("/v1/audit", params={"since_seq": everything[-1]["seq"]}, headers=auth(ADMIN)).json()
    assert last["next_since_seq"] is None
    assert client.get("/v1/audit", params={"limit": 0}, headers=auth(ADMIN)).status_code == 422


def test_verify_finds_tampering_and_checks_an_anchor(client: TestClient, repo: Any, uid: str) -> None:
    new_tenant(client, f"t{uid}")
    new_tenant(client, f"u{uid}")
    good = client.get("/v1/audit/verify", headers=auth(ADMIN)).json()
    assert good["ok"] is True and good["first_bad_seq"] is None and good["entries"] == 3
    anchor = {"anchor_seq": good["last_seq"], "anchor_hash": good["last_hash"]}
    assert client.get("/v1/audit/verify", params=anchor, headers=auth(ADMIN)).json()["ok"] is True
    assert client.get("/v1/audit/verify", params={"anchor_seq": 2}, headers=auth(ADMIN)).status_code == 400
    assert client.get("/v1/audit/verify", params={**anchor, "anchor_hash": "x"}, headers=auth(ADMIN)).status_code == 422
    with repo.driver.session() as s:
        s.run("MATCH (e:AuditEntry {seq: 2}) SET e.actor = 'mallory'").consume()
    bad = client.get("/v1/audit/verify", headers=auth(ADMIN)).json()
    assert bad["ok"] is False and bad["first_bad_seq"] == 2 and "does not match its fields" in bad["reason"]


def test_auditing_off_records_nothing(make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client(audit=False)
    new_tenant(client, f"t{uid}")
    assert audit(client) == []
    assert client.get("/readyz").json()["audit"]["enabled"] is False
    assert client.get("/v1/audit/verify", headers=auth(ADMIN)).json()["ok"] is True
