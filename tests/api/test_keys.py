"""Least privilege for keys: executor pools with their own keys and device limits, executors
bound to the pool that registered them, rotation and revocation of tenant and pool keys (refused
at once, and still after a restart), the inspection guard over HTTP, and ``slicesched keys``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.domain.error import InvalidInputError
from service.live.settings import ServiceSettings
from tests.api.conftest import ADMIN, EXECUTOR, auth, new_tenant

GIB = 2**30


def create_pool(client: TestClient, pool_id: str, **limits: Any) -> str:
    r = client.post("/v1/executor-pools", json={"pool_id": pool_id, **limits}, headers=auth(ADMIN))
    assert r.status_code == 201, r.text
    return str(r.json()["api_key"])


def register(client: TestClient, key: str, executor_id: str, *devices: tuple[str, str, int]) -> httpx.Response:
    return client.post("/v1/executors", headers=auth(key), json={
        "executor_id": executor_id, "host_id": "h",
        "devices": [{"device_id": d, "kind": kind, "mem_bytes": mem} for d, kind, mem in devices]})


def devices_of(client: TestClient, executor_id: str) -> list[str]:
    return [d["device_id"] for d in client.get("/v1/devices", headers=auth(ADMIN)).json()
            if d["executor_id"] == executor_id]


def test_executor_key_never_defaults_to_the_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLICESCHED_ADMIN_KEY", "admin-key-0123456789")
    monkeypatch.delenv("SLICESCHED_EXECUTOR_KEY", raising=False)
    assert ServiceSettings.from_env().executor_key is None
    with pytest.raises(InvalidInputError, match="differ from the admin key"):
        ServiceSettings(admin_key="same-key-0123456789", executor_key="same-key-0123456789")


def test_pools_are_admin_only_and_unique(client: TestClient, uid: str) -> None:
    tenant_key = new_tenant(client, f"t{uid}")
    body = {"pool_id": f"p{uid}"}
    assert client.post("/v1/executor-pools", json=body, headers=auth(tenant_key)).status_code == 403
    assert client.post("/v1/executor-pools", json=body, headers=auth(EXECUTOR)).status_code == 403
    key = create_pool(client, f"p{uid}", allowed_kinds=["cpu"], max_devices=2)
    assert key.startswith(f"pool-p{uid}_")
    assert client.post("/v1/executor-pools", json=body, headers=auth(ADMIN)).status_code == 409
    assert client.post("/v1/executor-pools", json={"pool_id": "bootstrap"}, headers=auth(ADMIN)).status_code == 409
    assert client.post("/v1/executor-pools", json={**body, "max_devices": True}, headers=auth(ADMIN)).status_code == 422
    pools = {p["pool_id"]: p for p in client.get("/v1/executor-pools", headers=auth(ADMIN)).json()}
    assert pools[f"p{uid}"]["allowed_kinds"] == ["cpu"] and pools[f"p{uid}"]["key"] == "active"
    assert "api_key" not in pools[f"p{uid}"] and "key_hash" not in pools[f"p{uid}"]


def test_a_pool_registers_only_allowed_devices_within_limits(client: TestClient, uid: str) -> None:
    key = create_pool(client, f"p{uid}", allowed_kinds=["cpu", "A100-80GB"], max_devices=2, max_mem_bytes=100 * GIB)
    refused = [
        (("cpu:0", "H100-80GB", 8 * GIB),),  # a kind outside the pool's
        (("cpu:0", "tpu-v9", 8 * GIB),),  # a kind nobody declares
        (("cpu:0", "cpu", 200 * GIB),),  # more memory than the pool allows per device
        (("cpu:0", "cpu", GIB), ("cpu:1", "cpu", GIB), ("cpu:2", "cpu", GIB)),  # more devices than the pool's
    ]
    for devices in refused:
        r = register(client, key, f"e{uid}", *devices)
        assert r.status_code == 403, r.text
        assert devices_of(client, f"e{uid}") == []  # a refused registration leaves nothing behind
    r = register(client, key, f"e{uid}", ("gpu:0", "A100-80GB", 90 * GIB))  # more than an A100-80GB has
    assert r.status_code == 400 and "A100-80GB" in r.json()["error"]["message"]
    assert register(client, key, f"e{uid}", ("cpu:0", "cpu", 8 * GIB), ("cpu:1", "cpu", 8 * GIB)).status_code == 200
    assert register(client, key, f"f{uid}", ("cpu:0", "cpu", 8 * GIB)).status_code == 403  # the pool is full
    # Re-registering an executor of the pool replaces its devices: within the limit again.
    assert register(client, key, f"e{uid}", ("cpu:0", "cpu", 8 * GIB)).status_code == 200
    assert register(client, key, f"f{uid}", ("cpu:0", "cpu", 8 * GIB)).status_code == 200
    # The bootstrap pool (SLICESCHED_EXECUTOR_KEY) takes the catalogue's kinds only.
    assert register(client, EXECUTOR, f"g{uid}", ("x:0", "tpu-v9", GIB)).status_code == 403
    # Admin keys keep every executor right.
    assert register(client, ADMIN, f"h{uid}", ("x:0", "tpu-v9", GIB)).status_code == 200


def test_executors_are_bound_to_their_pool(client: TestClient, uid: str) -> None:
    key_a, key_b = create_pool(client, f"a{uid}"), create_pool(client, f"b{uid}")
    tenant_key = new_tenant(client, f"t{uid}")
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(tenant_key)).status_code == 201
    assert register(client, key_a, f"e{uid}", ("cpu:0", "cpu", 2 * GIB)).status_code == 200
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "hi", "max_tokens": 2},
                      headers=auth(tenant_key)).json()["request_id"]
    poll = {"executor_id": f"e{uid}", "max_leases": 8, "wait_s": 0}
    hb = f"/v1/executors/e{uid}/heartbeat"
    # Another pool's key: the executor does not exist for it.
    assert client.post(hb, json={}, headers=auth(key_b)).status_code == 404
    assert client.post("/v1/leases/poll", json=poll, headers=auth(key_b)).status_code == 404
    assert client.post("/v1/leases/complete", json={"executor_id": f"e{uid}", "results": []},
                       headers=auth(key_b)).status_code == 404
    assert client.delete(f"/v1/executors/e{uid}", headers=auth(key_b)).status_code == 404
    assert register(client, key_b, f"e{uid}", ("cpu:0", "cpu", 2 * GIB)).status_code == 403
    # Its own pool's key and the admin key may.
    leases = client.post("/v1/leases/poll", json=poll, headers=auth(key_a)).json()["leases"]
    lease = next(x for x in leases if x["request_id"] == rid)
    assert client.post(f"/v1/leases/{lease['lease_id']}/renew", headers=auth(key_b)).status_code == 404
    assert client.post(f"/v1/leases/{lease['lease_id']}/fail", json={"reason": "x"},
                       headers=auth(key_b)).status_code == 404
    assert client.post(f"/v1/leases/{lease['lease_id']}/renew", headers=auth(key_a)).status_code == 200
    assert client.post(hb, json={"running": [lease["lease_id"]]}, headers=auth(key_a)).json()["renewed"] == [lease["lease_id"]]
    assert client.post(hb, json={}, headers=auth(ADMIN)).status_code == 200
    done = {"lease_id": lease["lease_id"], "output_tokens": [1, 2], "ttft_s": 0.1, "e2e_s": 0.2}
    r = client.post("/v1/leases/complete", json={"executor_id": f"e{uid}", "results": [done]}, headers=auth(key_a))
    assert r.json()["accepted"] == [lease["lease_id"]]


def test_tenant_keys_rotate_and_revoke_at_once_and_after_a_restart(make_client: Callable[..., TestClient],
                                                                   uid: str) -> None:
    client = make_client()
    old = new_tenant(client, f"t{uid}")
    other = new_tenant(client, f"o{uid}")
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(old)).status_code == 201
    # Another tenant cannot touch this tenant's key (404), the tenant itself and the admin can.
    assert client.post(f"/v1/tenants/t{uid}/keys/rotate", headers=auth(other)).status_code == 404
    assert client.post(f"/v1/tenants/nobody{uid}/keys/rotate", headers=auth(ADMIN)).status_code == 404
    r = client.post(f"/v1/tenants/t{uid}/keys/rotate", headers=auth(old))
    assert r.status_code == 200, r.text
    new = r.json()["api_key"]
    assert client.get(f"/v1/tenants/t{uid}", headers=auth(old)).status_code == 401  # at once
    assert client.get(f"/v1/tenants/t{uid}", headers=auth(new)).status_code == 200
    newer = client.post(f"/v1/tenants/t{uid}/keys/rotate", headers=auth(ADMIN)).json()["api_key"]
    assert client.get("/v1/catalog/models", headers=auth(new)).status_code == 401
    # A restart (a second service on the same Neo4j) keeps the rotation.
    restarted = make_client()
    assert restarted.get(f"/v1/tenants/t{uid}", headers=auth(old)).status_code == 401
    assert restarted.get(f"/v1/tenants/t{uid}", headers=auth(new)).status_code == 401
    assert restarted.get("/v1/catalog/models", headers=auth(newer)).json()[0]["model_id"] == "m"
    r = restarted.post(f"/v1/tenants/t{uid}/keys/revoke", headers=auth(ADMIN))
    assert r.status_code == 200 and r.json()["revoked"] is True
    assert restarted.get("/v1/catalog/models", headers=auth(newer)).status_code == 401
    again = make_client()  # the revocation survives a restart; the tenant and its models stay
    assert again.get("/v1/catalog/models", headers=auth(newer)).status_code == 401
    assert [m["model_id"] for m in again.get("/v1/catalog/models", params={"tenant_id": f"t{uid}"},
                                             headers=auth(ADMIN)).json()] == ["m"]
    fresh = again.post(f"/v1/tenants/t{uid}/keys/rotate", headers=auth(ADMIN)).json()["api_key"]
    assert again.get(f"/v1/tenants/t{uid}", headers=auth(fresh)).status_code == 200


def test_pool_keys_rotate_and_revoke(make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client()
    old = create_pool(client, f"p{uid}")
    assert register(client, old, f"e{uid}", ("cpu:0", "cpu", 2 * GIB)).status_code == 200
    new = client.post(f"/v1/executor-pools/p{uid}/keys/rotate", headers=auth(ADMIN)).json()["api_key"]
    assert client.post(f"/v1/executors/e{uid}/heartbeat", json={}, headers=auth(old)).status_code == 401
    assert client.post(f"/v1/executors/e{uid}/heartbeat", json={}, headers=auth(new)).status_code == 200
    restarted = make_client()
    assert register(restarted, old, f"x{uid}", ("cpu:0", "cpu", GIB)).status_code == 401
    assert register(restarted, new, f"x{uid}", ("cpu:0", "cpu", GIB)).status_code == 200
    r = restarted.post(f"/v1/executor-pools/p{uid}/keys/revoke", headers=auth(ADMIN))
    assert r.json() == {"pool_id": f"p{uid}", "revoked": True, "executors_dropped": [f"x{uid}"]}
    assert devices_of(restarted, f"x{uid}") == []
    assert register(restarted, new, f"x{uid}", ("cpu:0", "cpu", GIB)).status_code == 401
    assert make_client().post("/v1/executors", json={}, headers=auth(new)).status_code == 401
    for action in ("rotate", "revoke"):
        assert restarted.post(f"/v1/executor-pools/p{uid}/keys/{action}", headers=auth(old)).status_code == 401
        assert restarted.post(f"/v1/executor-pools/bootstrap/keys/{action}", headers=auth(ADMIN)).status_code == 409
        assert restarted.post(f"/v1/executor-pools/nope{uid}/keys/{action}", headers=auth(ADMIN)).status_code == 404


def test_inspect_refuses_load_csv_procedures_and_admin_commands(client: TestClient) -> None:
    for query, what in (("LOAD CSV FROM 'http://127.0.0.1:9/x' AS r RETURN r", "LOAD CSV"),
                        ("TERMINATE TRANSACTIONS 'neo4j-transaction-1'", "TERMINATE"),
                        ("SHOW TRANSACTIONS", "SHOW TRANSACTIONS"),
                        ("CALL db.clearQueryCaches()", "db.clearQueryCaches"),
                        ("/* x */ call dbms.listConfig()", "dbms.listConfig")):
        r = client.post("/v1/inspect", json={"query": query}, headers=auth(ADMIN))
        assert r.status_code == 403 and r.json()["error"]["kind"] == "read_only", r.text
        assert what in r.json()["error"]["message"]
    r = client.post("/v1/inspect", json={"query": "CALL db.labels() YIELD label RETURN label"}, headers=auth(ADMIN))
    assert r.status_code == 200


def test_keys_command(client: TestClient, uid: str, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import main

    old = new_tenant(client, f"t{uid}")
    monkeypatch.setenv("SLICESCHED_ADMIN_KEY", ADMIN)
    class SharedClient:  # the CLI's httpx.Client, answered by the app already running (no second lifespan)
        def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
            self.headers = headers

        def __enter__(self) -> SharedClient:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def post(self, path: str, json: object = None) -> httpx.Response:
            return client.post(path, json=json, headers=self.headers)

    monkeypatch.setattr(httpx, "Client", SharedClient)
    server = ["--server", "http://testserver"]
    assert main(["keys", "create-pool", f"p{uid}", "--kinds", "cpu", "--max-devices", "4", *server]) == 0
    assert f"executor pool p{uid}: new key pool-p{uid}_" in capsys.readouterr().out
    assert main(["keys", "rotate", "--tenant", f"t{uid}", "--json", *server]) == 0
    new = capsys.readouterr().out
    assert f"t{uid}_" in new and client.get("/v1/catalog/models", headers=auth(old)).status_code == 401
    assert main(["keys", "revoke", "--pool", f"p{uid}", *server]) == 0
    assert capsys.readouterr().out.strip() == f"executor pool p{uid}: key revoked"
    for argv in (["keys", "rotate", "--tenant", "a", "--pool", "b"], ["keys", "revoke"],
                 ["keys", "rotate", "--tenant", f"nobody{uid}"]):
        assert main([*argv, *server]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
    monkeypatch.undo()
    monkeypatch.setenv("SLICESCHED_ADMIN_KEY", ADMIN)
    assert main(["keys", "rotate", "--tenant", "x", "--server", "http://127.0.0.1:9"]) == 3
