"""The service follows a managed Neo4j that restarts on another port: while it is down,
calls fail fast with 503 and Retry-After and readiness says so; when it is back (elsewhere),
the service reconnects by itself and nothing accepted before is lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.graph.connection import Neo4jSettings
from service.graph.local_server import LocalNeo4j, free_port
from service.live.leader import OUTAGE_GRACE_TERMS
from tests.api.conftest import ADMIN, auth, settings
from tests.api.test_api import setup_tenant_model


@pytest.mark.slow
def test_service_follows_a_managed_neo4j_to_its_new_port(tmp_path: Path) -> None:
    state = tmp_path / "neo4j"
    server = LocalNeo4j(state, heap="384m", pagecache="64m")
    first = server.start(log=False)
    try:
        app = create_app(settings(Neo4jSettings(state_dir=state), db_timeout_s=1.0))
        with TestClient(app) as client:
            key = setup_tenant_model(client, "follow")
            rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "hi", "max_tokens": 2},
                              headers=auth(key)).json()["request_id"]
            server.stop()
            deadline = time.monotonic() + 15
            while client.get("/readyz").status_code != 503:
                assert time.monotonic() < deadline, "readiness never noticed Neo4j was down"
                time.sleep(0.2)
            t0 = time.monotonic()
            r = client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 1}, headers=auth(key))
            assert r.status_code == 503 and "retry-after" in r.headers and time.monotonic() - t0 < 3.0
            port = free_port()
            assert port != first.port
            server.start(port=port, log=False)
            deadline = time.monotonic() + 90
            while client.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, client.get("/readyz").json()
                time.sleep(0.2)
            assert client.get("/readyz").json()["neo4j"]["uri"].endswith(f":{port}")
            r = client.post("/v1/requests", json={"model_id": "m", "prompt": "y", "max_tokens": 1}, headers=auth(key))
            assert r.status_code == 202, r.text
            assert client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "queued"
            rows = client.post("/v1/inspect", json={"query": "MATCH (r:Request) RETURN count(r)"},
                               headers=auth(ADMIN)).json()["rows"]
            assert rows == [[2]]
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)  # two Neo4j starts and a model trace: minutes on a loaded two-core machine
def test_the_service_accepts_again_soon_after_neo4j_restarts_under_a_retrying_load(tmp_path: Path) -> None:
    """The path that stalled in the chaos run (up to 292 s): Neo4j stopped and started again on its
    port while clients keep retrying with their Idempotency-Keys. The first answer after the
    restart meets a cold server (its first query and every statement's plan: seconds each on a
    loaded machine); the service must take submissions again within 30 s of Neo4j answering,
    warm up once (not once per watcher tick), and lose no request it accepted."""
    import threading
    import uuid

    state = tmp_path / "neo4j"
    server = LocalNeo4j(state, heap="384m", pagecache="64m")
    first = server.start(log=False)
    stop = threading.Event()
    accepted: list[tuple[float, str]] = []  # (monotonic time of the 202, request id)
    try:
        app = create_app(settings(Neo4jSettings(state_dir=state), db_timeout_s=1.0))
        with TestClient(app) as client:
            svc = client.app.state.service  # type: ignore[attr-defined]
            key = setup_tenant_model(client, "reopen")

            def load(i: int) -> None:  # one logical request after another, each retried until accepted
                while not stop.is_set():
                    ik = uuid.uuid4().hex
                    while not stop.is_set():
                        try:
                            r = client.post("/v1/requests", json={"model_id": "m", "prompt": f"w{i}", "max_tokens": 1},
                                            headers={**auth(key), "Idempotency-Key": ik})
                        except Exception:  # a transport error: retried as a client would
                            time.sleep(0.2)
                            continue
                        if r.status_code == 202:
                            accepted.append((time.monotonic(), r.json()["request_id"]))
                            break
                        time.sleep(0.2)
                    time.sleep(0.1)

            workers = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(8)]
            for w in workers:
                w.start()
            deadline = time.monotonic() + 60
            while len(accepted) < 8:
                assert time.monotonic() < deadline, "the load was never accepted before the restart"
                time.sleep(0.1)
            print(f"{time.strftime('%X')} {len(accepted)} accepted before the restart", flush=True)
            server.stop()
            time.sleep(2.0)
            server.start(port=first.port, log=False)
            back = time.monotonic()
            print(f"{time.strftime('%X')} Neo4j answers again", flush=True)
            deadline = back + 30.0
            while not any(t > back for t, _ in accepted):
                assert time.monotonic() < deadline, (f"no submission accepted within 30 s of Neo4j answering again: "
                                                     f"{client.get('/readyz').json()}")
                time.sleep(0.1)
            recovered_s = min(t for t, _ in accepted if t > back) - back
            stop.set()
            for w in workers:
                w.join(timeout=30)
            assert svc.supervisor.loops["neo4j-watch"].failures <= 2, svc.supervisor.report()["neo4j-watch"]
            ids = sorted({rid for _, rid in accepted})
            rows = client.post("/v1/inspect", json={"query": "MATCH (r:Request) WHERE r.uid IN $ids RETURN count(r)",
                                                    "params": {"ids": ids}}, headers=auth(ADMIN)).json()["rows"]
            assert rows == [[len(ids)]], f"accepted {len(ids)}, in Neo4j {rows}"
            print(f"accepted again {recovered_s:.1f} s after Neo4j answered")
    finally:
        stop.set()
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)  # two Neo4j starts on a loaded two-core machine
def test_a_standby_follows_a_managed_neo4j_to_its_new_port_and_takes_over(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two services under leader election on a managed Neo4j that restarts on another port. The
    standby has no watcher of its own (only a leader runs one): it must follow the server from
    its failed asks, or a leader lost after the move leaves no leader at all (found in the
    chaos-slice run). Whichever process leads after the move, the other takes over when it stops
    renewing, on the new port."""
    from neo4j.exceptions import ServiceUnavailable

    ended: list[str] = []
    monkeypatch.setattr("service.live.service.end_process", ended.append)  # a deposed leader only records it
    ttl_s = 3.0
    state = tmp_path / "neo4j"
    server = LocalNeo4j(state, heap="384m", pagecache="64m")
    first = server.start(log=False)
    clients: list[TestClient] = []

    def ready(c: TestClient) -> bool:
        return c.get("/readyz").status_code == 200

    def wait(check: Any, timeout_s: float, why: str) -> float:
        start = time.monotonic()
        while not check():
            assert time.monotonic() - start < timeout_s, why
            time.sleep(0.1)
        return time.monotonic() - start

    try:
        for _ in range(2):
            c = TestClient(create_app(settings(Neo4jSettings(state_dir=state), db_timeout_s=1.0,
                                               leader_election=True, leader_ttl_s=ttl_s)))
            c.__enter__()
            clients.append(c)
            wait(lambda c=c: c.get("/readyz").json()["leadership"]["leader"] is not None, 60.0, "no first ask answered")
        a, b = clients
        wait(lambda: ready(a), 60.0, "the first service never led")
        assert b.get("/readyz").json()["leadership"]["role"] == "standby"

        server.stop()
        port = free_port()
        assert port != first.port
        server.start(port=port, log=False)
        wait(lambda: ready(a) or ready(b), 120.0, "no leader after Neo4j moved")
        if ready(a):  # the standby must have followed on its own, or it could never take over
            svc = a.app.state.service  # type: ignore[attr-defined]

            def partitioned() -> bool:
                raise ServiceUnavailable("partitioned from Neo4j")

            svc.leadership.contend = partitioned
            took_s = wait(lambda: ready(b), 60.0, f"the standby never took over: {b.get('/readyz').json()}")
            # the correctness is that it takes over at all (it could not without following the
            # server); the bound is the design's slowest case, a term ended unseen (the outage
            # grace) plus two terms of asking, with slack for a loaded machine (11.1 s seen once
            # against a bound of 11 s while other work shared the two cores)
            assert took_s <= (OUTAGE_GRACE_TERMS + 2) * ttl_s + 10.0, f"took over in {took_s:.1f} s"
        # b leads either way, connected to the server where it runs now
        ready_b = b.get("/readyz").json()
        assert ready_b["leadership"]["role"] == "leader" and ready_b["neo4j"]["uri"].endswith(f":{port}")
        assert b.post("/v1/tenants", json={"tenant_id": "after-move", "sla_class": "standard"},
                      headers=auth(ADMIN)).status_code == 201
    finally:
        for c in clients:
            c.__exit__(None, None, None)
        server.stop()
