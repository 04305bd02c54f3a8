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
