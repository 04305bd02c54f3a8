"""The HTTP API in process (TestClient) against the real Neo4j: the executor side is driven
by the test itself over HTTP, so leases, expiry and exactly-once are checked precisely."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi.testclient import TestClient

from tests.api.conftest import ADMIN, EXECUTOR, auth, new_tenant


def setup_tenant_model(client: TestClient, tenant: str, family: str = "tiny") -> str:
    key = new_tenant(client, tenant)
    r = client.post("/v1/catalog/models", json={"model_id": "m", "family": family}, headers=auth(key))
    assert r.status_code == 201, r.text
    return key


def register(client: TestClient, executor_id: str, devices: tuple[str, ...] = ("cpu:0",)) -> None:
    r = client.post("/v1/executors", json={"executor_id": executor_id, "host_id": "h",
                                           "devices": [{"device_id": d, "mem_bytes": 2 << 30} for d in devices]},
                    headers=auth(EXECUTOR))
    assert r.status_code == 200, r.text


def poll(client: TestClient, executor_id: str, n: int = 8, wait_s: float = 0.0) -> list[dict]:
    r = client.post("/v1/leases/poll", json={"executor_id": executor_id, "max_leases": n, "wait_s": wait_s},
                    headers=auth(EXECUTOR))
    assert r.status_code == 200, r.text
    return list(r.json()["leases"])


def leased_requests(client: TestClient, tenant: str, executor: str, n: int = 1) -> tuple[str, list[dict]]:
    """A new tenant with model ``m``, an executor with one device, ``n`` requests of 2 tokens
    submitted and leased by it: the tenant's key and the ``n`` leases (still running)."""
    key = setup_tenant_model(client, tenant)
    register(client, executor)
    rids = [client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 2},
                        headers=auth(key)).json()["request_id"] for _ in range(n)]
    leases = [x for x in poll(client, executor) if x["request_id"] in rids]
    assert len(leases) == n, leases
    return key, leases


def completion(lease: dict, tokens: list[int] | None = None) -> dict:
    return {"lease_id": lease["lease_id"], "output_tokens": tokens or [1] * lease["max_tokens"],
            "queued_s": 0.0, "ttft_s": 0.01, "e2e_s": 0.02, "iterations": lease["max_tokens"], "busy_s": 0.01}


def test_submit_lease_complete(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"a{uid}")
    register(client, f"e{uid}")
    r = client.post("/v1/requests", json={"model_id": "m", "prompt": "hello", "max_tokens": 4}, headers=auth(key))
    assert r.status_code == 202, r.text
    rid = r.json()["request_id"]
    leases = poll(client, f"e{uid}")
    mine = [x for x in leases if x["request_id"] == rid]
    assert len(mine) == 1
    lease = mine[0]
    assert lease["prompt_tokens"] == list(b"hello") and lease["family"] == "tiny" and "guest" not in lease
    assert lease["stages"] == [{"device_id": "cpu:0", "global_device_id": f"e{uid}/cpu:0", "layers": [0, 2]}]
    r = client.post("/v1/leases/complete", json={"executor_id": f"e{uid}", "results": [completion(lease, [104, 105, 33, 33])]},
                    headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [lease["lease_id"]]
    got = client.get(f"/v1/requests/{rid}", headers=auth(key)).json()
    assert got["status"] == "done" and got["output_tokens"] == [104, 105, 33, 33] and got["text"] == "hi!!"
    # A second completion of the same lease is rejected and changes nothing.
    r = client.post("/v1/leases/complete", json={"executor_id": f"e{uid}", "results": [completion(lease, [0, 0, 0, 0])]},
                    headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [] and len(r.json()["rejected"]) == 1
    assert client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["output_tokens"] == [104, 105, 33, 33]
    assert client.get("/metrics").status_code == 401 and client.get("/metrics", headers=auth(key)).status_code == 403
    metrics = client.get("/metrics", headers=auth(ADMIN)).text
    assert f'slicesched:request_success_total{{finished_reason="length",model_name="m",tenant="a{uid}"}} 1.0' in metrics
    assert 'slicesched:leases_total{event="completed"}' in metrics


def test_expired_lease_is_replaced_and_late_completion_rejected(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"b{uid}")
    register(client, f"x{uid}")
    register(client, f"y{uid}")
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt_tokens": [1, 2, 3], "max_tokens": 2},
                      headers=auth(key)).json()["request_id"]
    first = [x for x in poll(client, f"x{uid}") + poll(client, f"y{uid}") if x["request_id"] == rid]
    assert len(first) == 1
    holder = f"x{uid}" if first[0]["stages"][0]["global_device_id"].startswith(f"x{uid}") else f"y{uid}"
    other = f"y{uid}" if holder == f"x{uid}" else f"x{uid}"
    # The holder goes silent: no heartbeat. The other executor keeps heartbeating.
    deadline = time.monotonic() + 10
    second: list[dict] = []
    while time.monotonic() < deadline and not second:
        client.post(f"/v1/executors/{other}/heartbeat", json={"running": []}, headers=auth(EXECUTOR))
        second = [x for x in poll(client, other, wait_s=0.5) + poll(client, holder) if x["request_id"] == rid]
    assert second, "the expired lease was not leased again"
    assert second[0]["lease_id"] != first[0]["lease_id"]
    late = client.post("/v1/leases/complete", json={"executor_id": holder, "results": [completion(first[0], [7, 7])]},
                       headers=auth(EXECUTOR)).json()
    assert late["accepted"] == [] and "not live" in late["rejected"][0]["reason"]
    executor = other if second[0]["stages"][0]["global_device_id"].startswith(other) else holder
    ok = client.post("/v1/leases/complete", json={"executor_id": executor, "results": [completion(second[0], [5, 6])]},
                     headers=auth(EXECUTOR)).json()
    assert ok["accepted"] == [second[0]["lease_id"]]
    got = client.get(f"/v1/requests/{rid}", headers=auth(key)).json()
    assert got["status"] == "done" and got["output_tokens"] == [5, 6] and got["attempts"] == 2


def test_isolation_between_tenants(client: TestClient, uid: str) -> None:
    key_a = setup_tenant_model(client, f"ia{uid}")
    key_b = setup_tenant_model(client, f"ib{uid}")
    rid_b = client.post("/v1/requests", json={"model_id": "m", "prompt": "b", "max_tokens": 1},
                        headers=auth(key_b)).json()["request_id"]
    assert client.get(f"/v1/requests/{rid_b}", headers=auth(key_a)).status_code == 404
    assert client.post(f"/v1/requests/{rid_b}/cancel", headers=auth(key_a)).status_code == 404
    assert client.get("/v1/catalog/models/m", params={"tenant_id": f"ib{uid}"}, headers=auth(key_a)).status_code == 404
    assert client.get(f"/v1/tenants/ib{uid}", headers=auth(key_a)).status_code == 404
    assert all(r["tenant_id"] == f"ia{uid}" for r in client.get("/v1/requests", headers=auth(key_a)).json())
    r = client.post("/v1/inspect", json={"name": "my_requests", "params": {"tenant_id": f"ib{uid}"}}, headers=auth(key_a))
    assert r.status_code == 404
    time.sleep(0.3)  # the GMG writer's batch
    r = client.post("/v1/inspect", json={"name": "my_requests"}, headers=auth(key_b))
    assert r.status_code == 200 and [row[0] for row in r.json()["rows"]] == [rid_b]
    assert client.post("/v1/inspect", json={"name": "my_requests"}, headers=auth(key_a)).json()["rows"] == []
    assert client.post("/v1/inspect", json={"query": "MATCH (n) RETURN n"}, headers=auth(key_a)).status_code == 403
    assert client.post("/v1/inspect", json={"query": "CREATE (n:Evil) RETURN n"}, headers=auth(ADMIN)).status_code == 403
    assert client.post("/v1/tenants", json={"tenant_id": "z"}, headers=auth(key_a)).status_code == 403
    assert client.get("/v1/requests", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/v1/requests").status_code == 401


def test_bad_input_is_4xx_with_a_message(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"bad{uid}")
    h = auth(key)
    cases = [
        client.post("/v1/requests", content=b"{not json", headers={**h, "content-type": "application/json"}),
        client.post("/v1/requests", json={"model_id": "nope", "prompt": "x", "max_tokens": 1}, headers=h),
        client.post("/v1/requests", json={"model_id": "m", "prompt": "x" * 600, "max_tokens": 1}, headers=h),
        client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": -1}, headers=h),
        client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 10**9}, headers=h),
        client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 1, "sla_class": "gold"}, headers=h),
        client.post("/v1/requests", json={"model_id": "m", "prompt_tokens": [999], "max_tokens": 1}, headers=h),
        client.post("/v1/requests", json={"model_id": "m", "max_tokens": 1}, headers=h),
        client.post("/v1/catalog/models", json={"model_id": "m2", "family": "llama2-70b"}, headers=h),
        client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=h),
    ]
    for r in cases:
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["error"]["message"], r.text
    assert [r.status_code for r in cases] == [422, 404, 400, 422, 422, 400, 400, 400, 400, 409]
    # Nothing half-written: the tenant has no request at all.
    assert client.get("/v1/requests", headers=h).json() == []


def test_restart_keeps_accepted_requests(make_client: Callable[..., TestClient], uid: str) -> None:
    first = make_client()
    key = setup_tenant_model(first, f"r{uid}")
    ids = [first.post("/v1/requests", json={"model_id": "m", "prompt": f"p{i}", "max_tokens": 2},
                      headers=auth(key)).json()["request_id"] for i in range(3)]
    register(first, f"r{uid}e")
    leased = [x for x in poll(first, f"r{uid}e", n=1) if x["request_id"] in ids]
    assert len(leased) == 1
    first.__exit__(None, None, None)  # the service stops with a lease outstanding
    second = make_client()
    for rid in ids:  # the tenant key still works and every accepted request is there, queued again
        got = second.get(f"/v1/requests/{rid}", headers=auth(key))
        assert got.status_code == 200 and got.json()["status"] == "queued"
    register(second, f"r{uid}e")
    leases = [x for x in poll(second, f"r{uid}e", n=8) if x["request_id"] in ids]
    assert sorted(x["request_id"] for x in leases) == sorted(ids)
    # A completion of the old process's lease is rejected.
    old = second.post("/v1/leases/complete", json={"executor_id": f"r{uid}e", "results": [completion(leased[0])]},
                      headers=auth(EXECUTOR)).json()
    assert old["accepted"] == []


def test_cancel_and_whatif(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"c{uid}")
    register(client, f"c{uid}e", ("cpu:0", "cpu:1"))
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 3},
                      headers=auth(key)).json()["request_id"]
    assert client.post(f"/v1/requests/{rid}/cancel", headers=auth(key)).json()["status"] == "cancelled"
    assert client.post(f"/v1/requests/{rid}/cancel", headers=auth(key)).status_code == 409
    assert [x for x in poll(client, f"c{uid}e") if x["request_id"] == rid] == []
    r = client.post("/v1/whatif", json={"tenant_id": f"c{uid}", "model_id": "m", "device_ids": [f"c{uid}e/cpu:1"],
                                        "horizon_s": 5}, headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    assert r.json()["feasible"] and r.json()["baseline"]["memory_violations"] == 0
    assert client.post("/v1/whatif", json={"tenant_id": f"c{uid}", "model_id": "m", "device_ids": ["nope"]},
                       headers=auth(ADMIN)).status_code == 400
    policy = client.post("/v1/whatif", json={"placement": "replica", "horizon_s": 5}, headers=auth(ADMIN))
    assert policy.status_code == 200 and policy.json()["add"] == []  # nothing waiting: nothing to gain
    assert policy.json()["status"]["code"] == "no_backlog" and policy.json()["reasons"] == []  # ... and it says so
    assert client.post("/v1/whatif", json={"placement": "replica", "device_ids": ["x"]},
                       headers=auth(ADMIN)).status_code == 400
    assert client.post("/v1/whatif", json={"tenant_id": f"c{uid}", "model_id": "m", "device_ids": ["x"]},
                       headers=auth(key)).status_code == 403


def test_retention_deletes_old_live_slices_and_keeps_requests(client: TestClient, repo: object, uid: str) -> None:
    key = setup_tenant_model(client, f"ret{uid}")
    register(client, f"ret{uid}e")
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 2},
                      headers=auth(key)).json()["request_id"]
    [lease] = [x for x in poll(client, f"ret{uid}e") if x["request_id"] == rid]
    client.post("/v1/leases/complete", json={"executor_id": f"ret{uid}e", "results": [completion(lease)]},
                headers=auth(EXECUTOR))
    query = "MATCH (s:Slice {uid: $uid}) RETURN s.state, s.iterations"
    deadline = time.monotonic() + 10
    while client.post("/v1/inspect", json={"query": query, "params": {"uid": lease["lease_id"]}},
                      headers=auth(ADMIN)).json()["rows"] != [["done", 2]]:
        assert time.monotonic() < deadline, "the completed slice never reached the GMG"
        time.sleep(0.2)
    # retention deletes slices an hour old, long written; here the writer must be idle first, or a
    # row of this slice still batched (its start) lands after the delete and creates it again
    while client.get("/v1/stats", headers=auth(ADMIN)).json()["gmg_write_lag_s"]["pending"]:
        assert time.monotonic() < deadline + 20, "the GMG writer never caught up"
        time.sleep(0.2)
    assert repo.live.delete_old_live_slices(time.time() - 3600) == 0  # type: ignore[attr-defined]
    assert repo.live.delete_old_live_slices(time.time() + 1) >= 1  # type: ignore[attr-defined]
    assert client.post("/v1/inspect", json={"query": query, "params": {"uid": lease["lease_id"]}},
                       headers=auth(ADMIN)).json()["rows"] == []
    assert client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "done"


def test_lease_counters_equal_the_slices_in_the_gmg(client: TestClient, uid: str) -> None:
    """Every way a lease ends (completion, failure, cancellation, an executor re-registering or
    leaving with leases) is counted once, under the state its Slice has in the GMG."""
    key = setup_tenant_model(client, f"cnt{uid}")
    executor = f"cnt{uid}e"
    register(client, executor)
    rids = [client.post("/v1/requests", json={"model_id": "m", "prompt": f"p{i}", "max_tokens": 2},
                        headers=auth(key)).json()["request_id"] for i in range(5)]
    leases = {x["request_id"]: x for x in poll(client, executor)}
    assert sorted(leases) == sorted(rids)
    done, failed, cancelled = rids[:3]
    assert client.post("/v1/leases/complete", json={"executor_id": executor, "results": [completion(leases[done])]},
                       headers=auth(EXECUTOR)).json()["accepted"] == [leases[done]["lease_id"]]
    assert client.post(f"/v1/leases/{leases[failed]['lease_id']}/fail", json={"reason": "oom"},
                       headers=auth(EXECUTOR)).status_code == 200
    assert client.post(f"/v1/requests/{cancelled}/cancel", headers=auth(key)).status_code == 200
    register(client, executor)  # re-registration with two live leases: both are void
    again = poll(client, executor)
    assert len(again) == 3  # the failed request and the two voided ones
    assert client.delete(f"/v1/executors/{executor}", headers=auth(EXECUTOR)).status_code == 200  # leaves with 3

    expected = {"done": 1, "failed": 1, "cancelled": 1, "expired": 5}
    query = "MATCH (s:Slice {tenant_id: $t}) WHERE s.live RETURN s.state AS state, count(*) AS n"
    deadline = time.monotonic() + 10
    while True:
        rows = client.post("/v1/inspect", json={"query": query, "params": {"t": f"cnt{uid}"}},
                           headers=auth(ADMIN)).json()["rows"]
        in_gmg = {state: n for state, n in rows}
        if in_gmg == expected:
            break
        assert time.monotonic() < deadline, f"the GMG has {in_gmg}, expected {expected}"
        time.sleep(0.2)  # the GMG writer's batch
    counters = client.get("/v1/stats", headers=auth(ADMIN)).json()["counters"]
    assert counters["leases_granted"] == sum(in_gmg.values()) == 8
    assert {state: counters.get(name) for state, name in
            (("done", "leases_completed"), ("failed", "leases_failed"), ("cancelled", "leases_cancelled"),
             ("expired", "leases_expired"))} == in_gmg
    metrics = client.get("/metrics", headers=auth(ADMIN)).text
    assert 'slicesched:leases_total{event="expired"} 5.0' in metrics
    assert 'slicesched:leases_total{event="cancelled"} 1.0' in metrics


def test_booleans_and_strings_are_not_numbers(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"st{uid}")
    h = auth(key)
    executor = {"executor_id": f"st{uid}e", "host_id": "h"}
    cases = [
        ("/v1/requests", {"model_id": "m", "prompt": "x", "max_tokens": True}, h),
        ("/v1/requests", {"model_id": "m", "prompt": "x", "max_tokens": "2"}, h),
        ("/v1/requests", {"model_id": "m", "prompt": "x", "max_tokens": 2.5}, h),
        ("/v1/requests", {"model_id": "m", "prompt_tokens": [True, 1], "max_tokens": 1}, h),
        ("/v1/requests/batch", {"requests": [{"model_id": "m", "prompt": "x", "max_tokens": True}]}, h),
        ("/v1/tenants", {"tenant_id": f"st{uid}b", "weight": True}, auth(ADMIN)),
        ("/v1/tenants", {"tenant_id": f"st{uid}b", "priority": False}, auth(ADMIN)),
        ("/v1/models", {"model_id": "m2", "family": "tiny", "replicas": True}, h),
        ("/v1/models", {"model_id": "m2", "family": "tiny", "seed": True}, h),
        ("/v1/executors", {**executor, "devices": [{"device_id": "cpu:0", "mem_bytes": True}]}, auth(EXECUTOR)),
        ("/v1/leases/poll", {"executor_id": f"st{uid}e", "max_leases": True}, auth(EXECUTOR)),
        ("/v1/leases/poll", {"executor_id": f"st{uid}e", "wait_s": True}, auth(EXECUTOR)),
        ("/v1/whatif", {"placement": "replica", "horizon_s": True}, auth(ADMIN)),
    ]
    for path, body, headers in cases:
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 422, (path, body, r.status_code, r.text)
        assert r.json()["error"]["kind"] == "invalid_input"
    assert client.get("/v1/requests", headers=h).json() == []  # nothing was accepted
    assert client.get("/v1/requests", params={"limit": "true"}, headers=h).status_code == 422
    # a float field still takes an integer
    r = client.post("/v1/tenants", json={"tenant_id": f"st{uid}c", "weight": 2}, headers=auth(ADMIN))
    assert r.status_code == 201 and r.json()["weight"] == 2.0


def test_an_unknown_status_filter_is_a_400_naming_the_valid_ones(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"sf{uid}")
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 1},
                      headers=auth(key)).json()["request_id"]
    r = client.get("/v1/requests", params={"status": "bogus"}, headers=auth(key))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "bogus" in message and all(s in message for s in ("queued", "leased", "done", "cancelled", "failed"))
    assert [x["request_id"] for x in client.get("/v1/requests", params={"status": "queued"},
                                                 headers=auth(key)).json()] == [rid]
    assert client.get("/v1/requests", params={"status": "done"}, headers=auth(key)).json() == []


def test_openapi_documents_every_error_and_405_names_the_allowed_methods(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    error = {"$ref": "#/components/schemas/ErrorOut"}
    assert set(doc["components"]["schemas"]["ErrorOut"]["properties"]) == {"error"}
    assert set(doc["components"]["schemas"]["ErrorDetail"]["required"]) == {"kind", "message"}
    openai_error = {"$ref": "#/components/schemas/OpenAIErrorOut"}
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            if "openai" in op["tags"]:  # OpenAI's error shape, and a body off the schema is a 400 there
                assert "422" not in op["responses"], (path, method)
                for status in ("400", "401", "403", "404", "429", "503"):
                    assert op["responses"][status]["content"] == {"application/json": {"schema": openai_error}}
                continue
            for status in ("400", "401", "403", "404", "409", "422", "429", "503"):
                if (path, status) == ("/readyz", "503"):  # not ready: the readiness report (test_openapi)
                    continue
                assert op["responses"][status]["content"] == {"application/json": {"schema": error}}, (path, method)
    assert doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"] == {"text/plain": {"schema": {"type": "string"}}}
    r = client.delete("/v1/requests", headers=auth(ADMIN))  # two routes on the path: GET (list) and POST (submit)
    assert r.status_code == 405 and r.json()["error"]["kind"] == "http"
    assert r.headers["allow"] == "GET, POST"
    r = client.put("/v1/tenants/x", headers=auth(ADMIN))
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert client.delete("/v1/requests/batch", headers=auth(ADMIN)).headers["allow"] == "POST"  # not /{request_id}
    r = client.put("/v1/completions", headers=auth(ADMIN))
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error" and set(r.json()["error"]) == {"message", "type",
                                                                                               "param", "code"}


def test_openai_requests_for_a_model_no_executor_serves_are_refused_at_once(client: TestClient, uid: str) -> None:
    key = setup_tenant_model(client, f"ns{uid}")
    r = client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}, headers=auth(key))
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_served", r.text
    assert client.get("/v1/requests", headers=auth(key)).json() == []  # nothing was queued


def test_the_deprecated_model_route_registers_and_names_its_successor(client: TestClient, uid: str) -> None:
    key = new_tenant(client, f"d{uid}")
    r = client.post("/v1/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key))
    assert r.status_code == 201, r.text
    assert r.headers["deprecation"] == "true" and "</v1/catalog/models>" in r.headers["link"]
    listed = client.get("/v1/catalog/models", headers=auth(key)).json()
    assert [m["model_id"] for m in listed] == ["m"]
