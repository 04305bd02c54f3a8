"""The service follows a managed Neo4j that restarts on another port: while it is down,
calls fail fast with 503 and Retry-After and readiness says so; when it is back (elsewhere),
the service reconnects by itself and nothing accepted before is lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.graph.connection import Neo4jSettings
from service.graph.local_server import LocalNeo4j, free_port
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
