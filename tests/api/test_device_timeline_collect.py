"""A live run's device timeline (service.harness.timeline) read through the API from the GMG: a
lease granted and completed through the real lease path shows on its device, under its tenant,
with the device's owner from its home replica; one still running ends at the read."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from service.harness.timeline import collect_timeline
from tests.api.conftest import ADMIN, EXECUTOR, auth
from tests.api.test_api import completion, leased_requests


def test_collect_timeline_shows_each_lease_on_its_device_under_its_tenant(
        make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client(lease_ttl_s=30.0)
    tenant, executor = f"tl{uid}", f"tl{uid}e"
    device = f"{executor}/cpu:0"
    since = time.time()
    key, leases = leased_requests(client, tenant, executor, 2)
    done = leases[0]
    r = client.post("/v1/leases/complete", json={"executor_id": executor, "results": [completion(done)]},
                    headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [done["lease_id"]]
    deadline = time.monotonic() + 10
    while True:  # the running lease reaches the GMG with the writer's next batch
        until = time.time()
        tl = collect_timeline(client, since, headers=auth(ADMIN), until=until)
        [lane] = [x for x in tl.lanes if x.device_id == device]
        if len(lane.spans) == 2:
            break
        assert time.monotonic() < deadline, f"the leases never showed on {device}: {lane.spans}"
        time.sleep(0.1)
    assert lane.owner == tenant  # its home replica is there
    assert {s.tenant for s in lane.spans} == {tenant}
    states = sorted(s.state for s in lane.spans)
    assert states == ["done", "running"]
    for s in lane.spans:
        assert since <= s.start <= s.end <= until
    assert [s.end for s in lane.spans if s.state == "running"] == [until]  # clipped to the read
    summary = tl.summary()[device]
    assert summary["owner"] == tenant and summary["guests"] == [] and summary["guest_share"] == 0.0
    assert summary["leases"] == 2 and 0.0 < summary["held_share"] <= 1.0
    assert not tl.truncated
    # a key that is not the admin's is refused, with the API's message
    with pytest.raises(RuntimeError, match=r"/v1/(devices|stats): 403"):
        collect_timeline(client, since, headers=auth(key))
