"""``/readyz`` says when the lease path fails while Neo4j answers its pings (issue 41's hand probes:
every submission and completion was a 503 for about 100 s while ``/readyz`` said ready)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import auth, new_tenant


def test_readyz_is_503_while_submissions_fail_and_200_after_one_lands(make_client: Callable[..., TestClient],
                                                                      uid: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client(call_timeout_s=2.0)
    svc = client.app.state.service  # type: ignore[attr-defined]
    key = new_tenant(client, f"lp{uid}")
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"},
                       headers=auth(key)).status_code == 201
    body = {"model_id": "m", "prompt": "hi", "max_tokens": 2}
    assert client.get("/readyz").json()["lease_path"]["failing"] is False
    # the submissions' write hangs (as behind a starved thread pool or a locked graph), Neo4j answers pings
    release = threading.Event()
    create = svc.repo.live.create_requests

    def stuck(rows: list[dict[str, Any]]) -> Any:
        release.wait(60)
        return create(rows)

    monkeypatch.setattr(svc.repo.live, "create_requests", stuck)
    try:
        for _ in range(3):
            r = client.post("/v1/requests", json=body, headers=auth(key))
            assert r.status_code == 503, r.text
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["ready"] is False and r.json()["neo4j"]["reachable"] is True
        lease_path = r.json()["lease_path"]
        assert lease_path["failing"] is True and lease_path["failures_in_a_row"] == 3
        assert "no answer within" in lease_path["last_error"]
        assert client.get("/healthz").json()["status"] == "degraded"
    finally:
        release.set()
    monkeypatch.setattr(svc.repo.live, "create_requests", create)
    assert client.post("/v1/requests", json=body, headers=auth(key)).status_code == 202
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["lease_path"]["failing"] is False
