"""A lease running past its expected end stays busy in the GMG (in-process app, real Neo4j): its
executor's heartbeat renews it past the window written at the grant, the Slice's window moves to
the renewal's horizon, and the candidate-slot search offers the device only after it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import EXECUTOR, auth
from tests.api.test_api import completion, poll, register, setup_tenant_model
from tests.api.test_live_slices import busy_windows, offered_at


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # the writer's next batch
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_renewal_past_the_expected_end_keeps_the_device_busy(make_client: Callable[..., TestClient], repo: Any,
                                                               uid: str) -> None:
    client = make_client(lease_ttl_s=20.0)
    tenant, executor = f"rn{uid}", f"rn{uid}e"
    key = setup_tenant_model(client, tenant)
    register(client, executor)
    device = f"{executor}/cpu:0"
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": "x", "max_tokens": 2},
                      headers=auth(key)).json()["request_id"]
    [lease] = [x for x in poll(client, executor) if x["request_id"] == rid]
    _wait_for(lambda: bool(busy_windows(repo, device)), "the running lease never made its device busy")
    [(start, end)] = busy_windows(repo, device)
    assert end == start + 20.0  # nothing measured: the lease's time to live
    time.sleep(0.3)
    r = client.post(f"/v1/executors/{executor}/heartbeat", json={"running": [lease["lease_id"]], "busy_s": 0.0},
                    headers=auth(EXECUTOR))
    assert r.json()["renewed"] == [lease["lease_id"]]
    renewed_at = time.time()
    _wait_for(lambda: busy_windows(repo, device)[0][1] > end, "the renewal never reached the GMG")
    [(start2, end2)] = busy_windows(repo, device)
    assert start2 == start and end + 0.25 < end2 <= renewed_at + 20.0
    assert offered_at(repo, tenant, device, end) == end2  # busy past its first estimate, until the renewal's end

    r = client.post("/v1/leases/complete", json={"executor_id": executor, "results": [completion(lease)]},
                    headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [lease["lease_id"]]
    assert busy_windows(repo, device) == []
    [[state, e]] = repo.inspection.run_read("MATCH (s:Slice {uid: $u}) RETURN s.state, s.end_s", {"u": lease["lease_id"]}).rows
    assert state == "done" and e < end2  # its real end replaces the renewed estimate
