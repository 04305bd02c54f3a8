"""Reliability of the live service on the real Neo4j: no background loop dies of a bad
registration, nothing is reported done before it is durable, a restart reconciles what the
previous process left, and a retried submission with an Idempotency-Key creates nothing twice.
Faults are injected into the service's own calls (the database itself stays real)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from neo4j.exceptions import ServiceUnavailable

from tests.api.conftest import ADMIN, EXECUTOR, auth
from tests.api.test_api import completion, poll, register, setup_tenant_model


def submit(client: TestClient, key: str, *, headers: dict[str, str] | None = None, **body: Any) -> Any:
    return client.post("/v1/requests", json={"model_id": "m", "prompt_tokens": [1, 2], "max_tokens": 2, **body},
                       headers={**auth(key), **(headers or {})})


def done_slices(repo: Any, request_id: str) -> int:
    with repo.driver.session() as s:
        return int(s.run("MATCH (s:Slice {state: 'done'})-[:SERVES]->(:Request {uid: $uid}) RETURN count(s) AS n",
                         uid=request_id).single()["n"])


def violations(client: TestClient, since: float, stale_before: float) -> list[list[Any]]:
    r = client.post("/v1/inspect", json={"name": "reconciliation_violations",
                                         "params": {"since": since, "stale_before": stale_before}}, headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    return list(r.json()["rows"])


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_refused_registration_leaves_nothing_and_expiry_lives_on(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"r{uid}")
    for bad in ("b1", "b2"):  # a device too small for any model: refused, nothing registered
        r = client.post("/v1/executors", json={"executor_id": f"{bad}{uid}", "host_id": "h",
                                               "devices": [{"device_id": "cpu:0", "mem_bytes": 1}]},
                        headers=auth(EXECUTOR))
        assert r.status_code == 400 and "nothing was registered" in r.json()["error"]["message"]
    devices = client.get("/v1/devices", headers=auth(ADMIN)).json()
    assert not [d for d in devices if d["executor_id"].startswith(("b1", "b2"))]
    # A real executor takes a lease and goes silent: the lease expires and the executor is dropped.
    register(client, f"x{uid}")
    rid = submit(client, key).json()["request_id"]
    [lease] = [x for x in poll(client, f"x{uid}") if x["request_id"] == rid]
    wait_for(lambda: client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "queued")
    wait_for(lambda: f"x{uid}/cpu:0" not in {d["device_id"] for d in client.get("/v1/devices", headers=auth(ADMIN)).json()})
    register(client, f"x{uid}")  # it can come back
    ready = client.get("/readyz").json()
    assert ready["ready"] and ready["loops"]["lease-expiry"]["failures"] == 0, ready
    assert lease["lease_id"] not in [x["lease_id"] for x in poll(client, f"x{uid}")]


def test_a_model_with_no_home_is_reported_not_fatal(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"s{uid}")  # tiny
    big = client.post("/v1/catalog/models", json={"model_id": "big", "family": "gpt2-small"}, headers=auth(key))
    assert big.status_code == 201, big.text
    r = client.post("/v1/executors", json={"executor_id": f"e{uid}", "host_id": "h",
                                           "devices": [{"device_id": "cpu:0", "mem_bytes": 64 << 20}]},
                    headers=auth(EXECUTOR))
    assert r.status_code == 200, r.text  # tiny fits in 64 MiB; gpt2-small (500 MB) fits nowhere
    stats = client.get("/v1/stats", headers=auth(ADMIN)).json()
    assert f"s{uid}/big" in stats["unplaced_models"] and f"s{uid}/m" not in stats["unplaced_models"]
    rid = submit(client, key).json()["request_id"]
    assert [x for x in poll(client, f"e{uid}") if x["request_id"] == rid]


def test_completion_is_durable_before_it_is_acknowledged(client: TestClient, uid: str, repo: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.time()
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = setup_tenant_model(client, f"d{uid}")
    register(client, f"e{uid}")
    rid = submit(client, key).json()["request_id"]
    [lease] = [x for x in poll(client, f"e{uid}") if x["request_id"] == rid]
    real = svc.repo.live.complete_leases
    calls: list[int] = []

    def down_once(rows: list[dict[str, Any]]) -> set[str]:
        calls.append(len(rows))
        if len(calls) == 1:
            raise ServiceUnavailable("injected: Neo4j went away")
        return set(real(rows))

    monkeypatch.setattr(svc.repo.live, "complete_leases", down_once)
    body = {"executor_id": f"e{uid}", "results": [completion(lease, [4, 5])]}
    r = client.post("/v1/leases/complete", json=body, headers=auth(EXECUTOR))
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    got = client.get(f"/v1/requests/{rid}", headers=auth(key)).json()
    assert got["status"] == "leased" and got["output_tokens"] == []  # never shown done while not written
    assert done_slices(repo, rid) == 0
    wait_for(lambda: client.get("/readyz").status_code == 200)  # the watcher sees Neo4j answer again
    r = client.post("/v1/leases/complete", json=body, headers=auth(EXECUTOR))  # the executor retries
    assert r.status_code == 200 and r.json()["accepted"] == [lease["lease_id"]]
    assert done_slices(repo, rid) == 1
    with repo.driver.session() as s:
        stored = s.run("MATCH (r:Request {uid: $uid}) RETURN r.status AS status, r.output_tokens AS out", uid=rid).single()
    assert stored["status"] == "done" and list(stored["out"]) == [4, 5]
    assert violations(client, started, time.time()) == []


def test_a_completion_outliving_its_bound_is_applied_once_when_it_lands(make_client: Callable[..., TestClient],
                                                                         uid: str, repo: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client(call_timeout_s=2.0)
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = setup_tenant_model(client, f"l{uid}")
    register(client, f"e{uid}")
    rid = submit(client, key).json()["request_id"]
    [lease] = [x for x in poll(client, f"e{uid}") if x["request_id"] == rid]
    real = svc.repo.live.complete_leases
    release = threading.Event()

    def slow(rows: list[dict[str, Any]]) -> set[str]:
        release.wait(20)
        return set(real(rows))

    monkeypatch.setattr(svc.repo.live, "complete_leases", slow)
    body = {"executor_id": f"e{uid}", "results": [completion(lease, [4, 5])]}
    t0 = time.monotonic()
    r = client.post("/v1/leases/complete", json=body, headers=auth(EXECUTOR))
    assert r.status_code == 503 and time.monotonic() - t0 < 6.0  # bounded: the executor will retry
    retry = client.post("/v1/leases/complete", json=body, headers=auth(EXECUTOR)).json()
    assert retry["accepted"] == [] and "finishing" in retry["rejected"][0]["reason"]
    assert client.post(f"/v1/requests/{rid}/cancel", headers=auth(key)).status_code == 409
    release.set()  # the first write lands: it is applied, once
    wait_for(lambda: client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "done")
    assert done_slices(repo, rid) == 1


def test_cancel_is_durable_before_it_is_answered(client: TestClient, uid: str, repo: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = setup_tenant_model(client, f"c{uid}")
    rid = submit(client, key).json()["request_id"]
    real = svc.repo.live.finish_requests
    monkeypatch.setattr(svc.repo.live, "finish_requests", lambda rows: (_ for _ in ()).throw(ServiceUnavailable("x")))
    assert client.post(f"/v1/requests/{rid}/cancel", headers=auth(key)).status_code == 503
    assert client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "queued"
    monkeypatch.setattr(svc.repo.live, "finish_requests", real)
    wait_for(lambda: client.get("/readyz").status_code == 200)
    r = client.post(f"/v1/requests/{rid}/cancel", headers=auth(key))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    with repo.driver.session() as s:
        assert s.run("MATCH (r:Request {uid: $uid}) RETURN r.status AS s", uid=rid).single()["s"] == "cancelled"


def test_restart_closes_open_slices_and_counts_attempts(make_client: Callable[..., TestClient], uid: str,
                                                        repo: Any) -> None:
    started = time.time()
    first = make_client()
    key = setup_tenant_model(first, f"t{uid}")
    register(first, f"e{uid}")
    rid = submit(first, key).json()["request_id"]
    [lease] = [x for x in poll(first, f"e{uid}") if x["request_id"] == rid]
    svc = first.app.state.service  # type: ignore[attr-defined]
    wait_for(lambda: svc.writer.pending == 0)
    first.__exit__(None, None, None)  # the process ends with the lease open
    with repo.driver.session() as s:
        assert s.run("MATCH (s:Slice {uid: $uid}) RETURN s.end_wall AS e", uid=lease["lease_id"]).single()["e"] is None
    second = make_client()
    with repo.driver.session() as s:
        row = s.run("MATCH (s:Slice {uid: $uid}) RETURN s.state AS state, s.end_wall AS e", uid=lease["lease_id"]).single()
    assert row["state"] == "abandoned" and row["e"] is not None
    got = second.get(f"/v1/requests/{rid}", headers=auth(key)).json()
    assert got["status"] == "queued" and got["attempts"] == 1
    assert violations(second, started, time.time()) == []
    register(second, f"e{uid}")
    [again] = [x for x in poll(second, f"e{uid}") if x["request_id"] == rid]
    ok = second.post("/v1/leases/complete", json={"executor_id": f"e{uid}", "results": [completion(again)]},
                     headers=auth(EXECUTOR)).json()
    assert ok["accepted"] == [again["lease_id"]] and done_slices(repo, rid) == 1
    assert second.get(f"/v1/requests/{rid}", headers=auth(key)).json()["attempts"] == 2


def test_idempotency_key_returns_the_first_answer(client: TestClient, uid: str, repo: Any) -> None:
    key = setup_tenant_model(client, f"i{uid}")
    other = setup_tenant_model(client, f"j{uid}")
    h = {"Idempotency-Key": f"k-{uid}"}
    first = submit(client, key, headers=h)
    again = submit(client, key, headers=h)
    assert first.status_code == again.status_code == 202 and first.json() == again.json()
    assert submit(client, key, headers=h, max_tokens=3).status_code == 409  # same key, another request
    assert submit(client, other, headers=h).json()["request_id"] != first.json()["request_id"]  # keys are per tenant
    batch = {"requests": [{"model_id": "m", "prompt": "a", "max_tokens": 1}, {"model_id": "m", "prompt": "b", "max_tokens": 1}]}
    hb = {**auth(key), "Idempotency-Key": f"b-{uid}"}
    b1 = client.post("/v1/requests/batch", json=batch, headers=hb)
    b2 = client.post("/v1/requests/batch", json=batch, headers=hb)
    assert b1.status_code == b2.status_code == 202 and b1.json() == b2.json()
    with repo.driver.session() as s:
        n = s.run("MATCH (r:Request {tenant_id: $t}) RETURN count(r) AS n", t=f"i{uid}").single()["n"]
    assert n == 3  # one single request and two batch items, however often they were sent


def test_idempotency_key_survives_a_restart(make_client: Callable[..., TestClient], uid: str) -> None:
    first = make_client()
    key = setup_tenant_model(first, f"k{uid}")
    h = {"Idempotency-Key": f"k-{uid}"}
    rid = submit(first, key, headers=h).json()["request_id"]
    first.__exit__(None, None, None)
    second = make_client()
    assert submit(second, key, headers=h).json()["request_id"] == rid


def test_submission_fails_fast_while_neo4j_is_down(client: TestClient, uid: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = setup_tenant_model(client, f"f{uid}")
    monkeypatch.setattr(svc.gate, "ping", lambda: False)  # the watcher finds Neo4j silent
    wait_for(lambda: not svc.db_up)
    t0 = time.monotonic()
    r = submit(client, key)
    assert r.status_code == 503 and r.headers["retry-after"] == "2" and time.monotonic() - t0 < 1.0
    assert client.get("/readyz").status_code == 503 and client.get("/healthz").json()["status"] == "degraded"
    assert client.get("/readyz").json()["neo4j"]["reachable"] is False
    monkeypatch.undo()
    wait_for(lambda: client.get("/readyz").status_code == 200)
    assert submit(client, key).status_code == 202


def test_soft_writes_wait_out_an_outage_and_are_flushed(make_client: Callable[..., TestClient], uid: str, repo: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # a lease that outlives the outage however slow the machine: this is about the writer, and a
    # lease expiring meanwhile (2 s in the other tests) would rightly end the Slice as "expired"
    client = make_client(lease_ttl_s=120.0)
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = setup_tenant_model(client, f"w{uid}")
    register(client, f"e{uid}")
    rid = submit(client, key).json()["request_id"]
    real = svc.repo.live.create_slices
    monkeypatch.setattr(svc.repo.live, "create_slices", lambda rows: (_ for _ in ()).throw(ServiceUnavailable("x")))
    [lease] = [x for x in poll(client, f"e{uid}") if x["request_id"] == rid]
    wait_for(lambda: svc.supervisor.loops["gmg-writer"].failures >= 1)
    assert svc.writer.pending >= 1
    metrics = client.get("/metrics", headers=auth(ADMIN)).text
    assert "slicesched:gmg_writer_queue_depth" in metrics and 'slicesched:loop_failures_total{loop="gmg-writer"}' in metrics
    monkeypatch.setattr(svc.repo.live, "create_slices", real)
    wait_for(lambda: svc.writer.pending == 0, timeout_s=15)
    with repo.driver.session() as s:
        row = s.run("MATCH (s:Slice {uid: $uid})-[:SERVES]->(r:Request) RETURN s.state AS state, r.uid AS r",
                    uid=lease["lease_id"]).single()
    assert row is not None and row["state"] == "running" and row["r"] == rid
    assert svc.writer.rows_dropped == 0


def test_a_completion_whose_answer_was_lost_is_taken_from_neo4j(client: TestClient, uid: str, repo: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.time()
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = setup_tenant_model(client, f"a{uid}")
    register(client, f"e{uid}")
    rid = submit(client, key).json()["request_id"]
    [lease] = [x for x in poll(client, f"e{uid}") if x["request_id"] == rid]
    real = svc.repo.live.complete_leases

    def committed_but_lost(rows: list[dict[str, Any]]) -> set[str]:
        real(rows)  # the transaction commits ...
        raise ServiceUnavailable("injected: the connection dropped before the answer")  # ... its answer is lost

    monkeypatch.setattr(svc.repo.live, "complete_leases", committed_but_lost)
    body = {"executor_id": f"e{uid}", "results": [completion(lease, [4, 5])]}
    assert client.post("/v1/leases/complete", json=body, headers=auth(EXECUTOR)).status_code == 503
    monkeypatch.setattr(svc.repo.live, "complete_leases", real)
    wait_for(lambda: client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "done")
    got = client.get(f"/v1/requests/{rid}", headers=auth(key)).json()
    assert got["output_tokens"] == [4, 5] and done_slices(repo, rid) == 1
    retry = client.post("/v1/leases/complete", json=body, headers=auth(EXECUTOR)).json()
    assert retry["accepted"] == []  # the executor's retry changes nothing
    assert rid not in [x["request_id"] for x in poll(client, f"e{uid}")]  # and it never runs again
    wait_for(lambda: svc.writer.pending == 0)
    assert violations(client, started, time.time()) == []
