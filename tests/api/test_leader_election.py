"""Two services on one database under leader election (service/live/leader.py): one leads, the
other stands by (503 ``not_leader``, /readyz 503 with its role), takes over once the leader stops
renewing its term, and serves what the leader accepted; the old leader refuses calls, finds
itself deposed and stops, and its writes are refused by the fence."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from neo4j.exceptions import ServiceUnavailable

from service.domain.error import NotLeaderError
from tests.api.conftest import ADMIN, auth

TTL_S = 3.0  # renewals every 0.6 s, a leader stops writing 2 s after its last; room for a loaded machine


@pytest.fixture(autouse=True)
def _no_process_ends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A deposed leader ends its process (serve): here, it is only recorded."""
    ended: list[str] = []
    monkeypatch.setattr("service.live.service.end_process", ended.append)
    return ended


def _wait(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check`` holds (it must within ``timeout_s``)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.05)
    return time.monotonic() - start


def test_the_standby_takes_over_when_the_leader_stops_renewing(make_client: Callable[..., TestClient], repo: Any,
                                                               uid: str) -> None:
    with repo.driver.session() as s:
        s.run("MATCH (l:Leader) DETACH DELETE l").consume()
    a = make_client(leader_election=True, leader_ttl_s=TTL_S)
    _wait(lambda: a.get("/readyz").status_code == 200, 60.0)
    assert a.get("/readyz").json()["leadership"]["role"] == "leader"
    b = make_client(leader_election=True, leader_ttl_s=TTL_S)
    _wait(lambda: b.get("/readyz").json()["leadership"]["leader"] is not None, 30.0)  # its first ask answered
    r = b.get("/readyz")
    assert r.status_code == 503 and r.json()["leadership"]["role"] == "standby"
    assert r.json()["leadership"]["leader"] == a.app.state.service.leadership.holder
    r = b.get("/v1/stats", headers=auth(ADMIN))
    assert r.status_code == 503 and r.json()["error"]["kind"] == "not_leader" and "Retry-After" in r.headers
    assert r.headers["Connection"] == "close"  # behind a Service, the retry reconnects
    assert "standby" in r.json()["error"]["message"]

    tenant = f"lead{uid}"
    r = a.post("/v1/tenants", json={"tenant_id": tenant, "sla_class": "standard"}, headers=auth(ADMIN))
    assert r.status_code == 201, r.text

    # The leader stops renewing (a partition, a frozen process): the standby takes over once
    # its term ends, recovering what the leader accepted.
    svc_a = a.app.state.service
    stopped: list[str] = []
    svc_a.on_fatal = stopped.append

    def partitioned() -> bool:
        raise ServiceUnavailable("partitioned from Neo4j")

    svc_a.leadership.contend = partitioned
    took_s = _wait(lambda: b.get("/readyz").status_code == 200, 30.0)
    assert took_s <= 2 * TTL_S + 5.0
    lead_b = b.get("/readyz").json()["leadership"]
    assert lead_b["role"] == "leader" and lead_b["epoch"] == svc_a.leadership.epoch + 1
    assert b.get(f"/v1/tenants/{tenant}", headers=auth(ADMIN)).status_code == 200

    # The old leader refuses calls (its own deadline has passed) ...
    r = a.post("/v1/tenants", json={"tenant_id": f"late{uid}", "sla_class": "standard"}, headers=auth(ADMIN))
    assert r.status_code == 503 and r.json()["error"]["kind"] == "not_leader"
    # ... learns at its next ask that it was deposed, and stops ...
    del svc_a.leadership.contend
    _wait(lambda: bool(stopped), 10.0)
    assert "deposed" in stopped[0] and svc_a.leadership.deposed
    # ... and a write it makes past its deadline (a process that wakes up late) is rolled back.
    svc_a.leadership._deadline = math.inf
    with pytest.raises(NotLeaderError):
        svc_a.repo.models.upsert_tenant(f"late{uid}", sla_class="standard")
    assert b.get(f"/v1/tenants/late{uid}", headers=auth(ADMIN)).status_code == 404
    assert b.post("/v1/tenants", json={"tenant_id": f"new{uid}", "sla_class": "standard"},
                  headers=auth(ADMIN)).status_code == 201


def test_the_leader_renews_while_every_shared_worker_thread_is_busy(make_client: Callable[..., TestClient],
                                                                    repo: Any) -> None:
    """The renewals run on a thread of their own. On the event loop's shared pool (six threads on
    two cores) they queued behind calls waiting out a Neo4j outage; the leader, back late, lost its
    term to the standby after a Neo4j restart (the chaos-slice run)."""
    with repo.driver.session() as s:
        s.run("MATCH (l:Leader) DETACH DELETE l").consume()
    a = make_client(leader_election=True, leader_ttl_s=TTL_S)
    _wait(lambda: a.get("/readyz").status_code == 200, 60.0)
    svc = a.app.state.service
    loop_health = svc.supervisor.loops["leadership"]
    release = threading.Event()

    async def clog() -> None:  # every thread of the shared pool busy (any pool's size)
        loop = asyncio.get_running_loop()
        for _ in range(64):
            loop.run_in_executor(None, release.wait, 60.0)

    try:
        a.portal.call(clog)  # type: ignore[union-attr]
        ticks = loop_health.ticks
        time.sleep(2 * TTL_S)  # past the deadline of a leader that could not renew
        assert loop_health.ticks >= ticks + 3, "the renewals waited for a shared worker thread"
        assert svc.leadership.leads and svc.leadership.describe()["role"] == "leader"
    finally:
        release.set()


def test_a_stopped_leader_hands_over_at_once(make_client: Callable[..., TestClient], repo: Any) -> None:
    with repo.driver.session() as s:
        s.run("MATCH (l:Leader) DETACH DELETE l").consume()
    a = make_client(leader_election=True, leader_ttl_s=30.0)
    _wait(lambda: a.get("/readyz").status_code == 200, 60.0)
    b = make_client(leader_election=True, leader_ttl_s=30.0)
    assert b.get("/readyz").status_code == 503
    a.__exit__(None, None, None)  # a clean stop releases the term: no wait for its 30 s to end
    _wait(lambda: b.get("/readyz").status_code == 200, 20.0)


def test_election_settings_are_checked(make_client: Callable[..., TestClient]) -> None:
    from service.domain.error import InvalidInputError
    from service.live.settings import ServiceSettings

    with pytest.raises(InvalidInputError, match="leader_ttl_s"):
        ServiceSettings(admin_key=ADMIN, leader_ttl_s=0.5)
