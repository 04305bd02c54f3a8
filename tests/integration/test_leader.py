"""Leader election and fencing on the real Neo4j (service/live/leader.py): one contender leads,
another stands by and takes over once the term ends unrenewed, with a new epoch; the deposed
leader's writes are rolled back by the fence, its local deadline stops it first; a released
term is taken at once."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from service.domain.error import NotLeaderError
from service.graph.repository import GraphRepository
from service.live.leader import Leadership


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _repo(driver: Any) -> GraphRepository:
    return GraphRepository(driver)


def _tenant_key(repo: GraphRepository, tenant: str) -> str | None:
    rows = [r for r in repo.live.live_tenants() if r["tenant_id"] == tenant]
    return rows[0].get("key_hash") if rows else None


def test_one_leads_the_other_takes_over_when_the_term_ends_and_the_deposed_write_is_refused(
        repo: GraphRepository, driver: Any) -> None:
    name = f"test-{secrets.token_hex(4)}"  # a leadership of this test's own
    a_repo, b_repo = _repo(driver), _repo(driver)
    Leadership(a_repo.live, ttl_s=1.0, name=f"warm-{name}").contend()  # the queries planned, off the clock below
    a = Leadership(a_repo.live, ttl_s=2.0, holder="a", name=name)
    b = Leadership(b_repo.live, ttl_s=2.0, holder="b", name=name)
    assert a.contend() and a.leads and a.epoch is not None
    first = a.epoch
    assert not b.contend() and not b.leads and b.describe()["role"] == "standby"
    assert b.last is not None and b.last.holder == "a"
    # A renewal keeps the epoch; the standby still loses while the term is renewed.
    assert a.contend() and a.epoch == first
    assert not b.contend()

    a_repo.fence = a
    tenant = f"fence{secrets.token_hex(3)}"
    repo.models.upsert_tenant(tenant, name=tenant)
    a_repo.live.set_tenant_key(tenant, "h-by-a")  # the leader writes
    assert _tenant_key(repo, tenant) == "h-by-a"

    time.sleep(2.2)  # the term ends on the server's clock, unrenewed
    assert not b.contend()  # the first ask that finds it ended starts the grace (half a term) ...
    time.sleep(1.1)
    assert b.contend() and b.leads and b.epoch == first + 1  # ... a later one takes it
    b_repo.fence = b
    # a's own deadline has passed as well: refused before the database is asked
    assert not a.leads
    with pytest.raises(NotLeaderError):
        a_repo.live.set_tenant_key(tenant, "h-by-a-late")
    # Even with its local deadline forced open (a paused process that wakes up), the fence's
    # read inside the transaction refuses it and rolls the write back.
    a._deadline = float("inf")
    with pytest.raises(NotLeaderError, match="no longer leads"):
        a_repo.live.set_tenant_key(tenant, "h-by-a-late")
    assert a.deposed and a.describe()["role"] == "deposed"
    assert _tenant_key(repo, tenant) == "h-by-a"
    b_repo.live.set_tenant_key(tenant, "h-by-b")  # the new leader writes
    assert _tenant_key(repo, tenant) == "h-by-b"
    # The deposed one cannot renew its way back while b's term runs.
    assert not a.contend() and a.deposed


def test_a_leader_that_missed_its_renewals_keeps_its_epoch_if_nobody_took_over(driver: Any) -> None:
    name = f"test-{secrets.token_hex(4)}"
    clock = Clock()
    a = Leadership(_repo(driver).live, ttl_s=1.0, holder="a", name=name, clock=clock)
    assert a.contend()
    epoch = a.epoch
    clock.t += 5.0  # its own deadline passes: it stops writing
    assert not a.leads and a.describe()["role"] == "renewing"
    time.sleep(1.1)  # the term ends on the server too, and nobody else asks
    assert a.contend() and a.epoch == epoch and a.leads


def test_a_leader_back_from_an_outage_renews_within_the_grace_before_the_standby_takes_over(driver: Any) -> None:
    """Neo4j down for longer than a term: when it answers again, every term has ended. The
    standby asks first and finds it ended; the leader, asking within the grace, keeps its epoch
    (it holds the warm state), and the standby stays a standby."""
    name = f"test-{secrets.token_hex(4)}"
    a = Leadership(_repo(driver).live, ttl_s=2.0, holder="a", name=name)
    b = Leadership(_repo(driver).live, ttl_s=2.0, holder="b", name=name)
    assert a.contend() and not b.contend()
    epoch = a.epoch
    time.sleep(2.2)  # the outage: nobody reaches the server while the term ends
    assert not b.contend() and b.last is not None and b.last.holder == "a"
    assert a.contend() and a.epoch == epoch and a.leads
    time.sleep(1.1)  # past the grace b started: the renewed term is not b's to take
    assert not b.contend() and not a.deposed


def test_a_term_nobody_saw_end_stands_longer_so_the_leader_of_a_restarted_server_keeps_it(driver: Any) -> None:
    """An ended term first seen more than a term after its end means nobody reached the server (a
    Neo4j restart): the standby waits three terms more than the grace, for the leader's first ask
    on a cold server (seconds in the chaos-slice run); a leader that never comes back is still
    replaced after that."""
    name = f"test-{secrets.token_hex(4)}"
    a = Leadership(_repo(driver).live, ttl_s=1.0, holder="a", name=name)
    b = Leadership(_repo(driver).live, ttl_s=1.0, holder="b", name=name)
    assert a.contend() and not b.contend()
    epoch = a.epoch
    time.sleep(2.3)  # the outage: the term ended 1.3 s ago, unseen
    assert not b.contend()  # first seen ended: the grace starts, with the outage's added
    time.sleep(1.0)  # past the plain grace (half a term)
    assert not b.contend() and b.last is not None and b.last.holder == "a"
    assert a.contend() and a.epoch == epoch and not a.deposed  # the slow leader renews its own term

    c = Leadership(_repo(driver).live, ttl_s=1.0, holder="c", name=f"{name}-gone")
    d = Leadership(_repo(driver).live, ttl_s=1.0, holder="d", name=f"{name}-gone")
    assert c.contend() and not d.contend()
    time.sleep(2.3)  # the outage, and c never comes back
    assert not d.contend()
    time.sleep(3.8)  # the grace and the outage's three terms
    assert d.contend() and d.epoch == (c.epoch or 0) + 1


def test_a_renewal_that_waited_for_the_lock_counts_its_term_from_when_it_got_it(driver: Any) -> None:
    """An ask that waits (for the Leader node's lock, for a cold server) starts its term when it
    holds the lock, not when its statement started: with the statement's clock, a renewal that
    waited longer than a term committed a term already over, and the standby took it at once
    (the chaos-slice run: a 4.2 s renewal, deposed 1.3 s later)."""
    import threading

    name = f"test-{secrets.token_hex(4)}"
    a = Leadership(_repo(driver).live, ttl_s=2.0, holder="a", name=name)
    b = Leadership(_repo(driver).live, ttl_s=2.0, holder="b", name=name)
    assert a.contend() and not b.contend()
    renewed: list[bool] = []
    with driver.session() as s:
        tx = s.begin_transaction()
        tx.run("MATCH (l:Leader {name: $name}) SET l.held_by_test = true", name=name).consume()  # its lock
        asking = threading.Thread(target=lambda: renewed.append(a.contend()))
        asking.start()
        time.sleep(2.5)  # longer than the term: the renewal waits for the lock
        tx.commit()
    asking.join(30.0)
    assert renewed == [True] and a.last is not None and a.last.left_s > 1.0
    assert not b.contend() and b.last is not None and b.last.holder == "a" and b.last.left_s > 0.5


def test_an_ask_that_cannot_reach_neo4j_fails_at_once_not_after_the_drivers_retries() -> None:
    """An ask is one attempt: the caller asks again at its own cadence (a fifth of a term). Left
    to the driver's retries (for up to the driver's retry time, pauses doubling to a second and
    more), a leader whose Neo4j had come back renewed too late, and the standby's grace ended
    first (the chaos-slice run's leadership flip after a Neo4j restart)."""
    from neo4j import GraphDatabase
    from neo4j.exceptions import ServiceUnavailable

    from service.graph.local_server import free_port

    with GraphDatabase.driver(f"bolt://127.0.0.1:{free_port()}", auth=("neo4j", "unused"),
                              max_transaction_retry_time=60.0, connection_timeout=2.0) as nowhere:
        a = Leadership(_repo(nowhere).live, ttl_s=3.0, holder="a", name="unreachable")
        start = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            a.contend()
        assert time.monotonic() - start < 30.0  # the driver's retries would have taken 60 s
        assert not a.leads and a.epoch is None


def test_a_released_term_is_taken_at_once(driver: Any) -> None:
    name = f"test-{secrets.token_hex(4)}"
    a = Leadership(_repo(driver).live, ttl_s=60.0, holder="a", name=name)
    b = Leadership(_repo(driver).live, ttl_s=60.0, holder="b", name=name)
    assert a.contend() and not b.contend()
    a.release()
    assert not a.leads
    assert b.contend() and b.epoch == (a.epoch or 0) + 1


def test_bad_terms_are_refused(driver: Any) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        Leadership(_repo(driver).live, ttl_s=0.0)
