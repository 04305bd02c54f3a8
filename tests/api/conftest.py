"""An in-process app (FastAPI TestClient, lifespan included) on the session's real Neo4j."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.core.scheduler import ClusterView, Decision
from service.graph.connection import Neo4jSettings
from service.live.settings import ServiceSettings

ADMIN = "admin-test-key"
EXECUTOR = "executor-test-key"


def settings(neo4j: Neo4jSettings, **overrides: Any) -> ServiceSettings:
    # the roofline costs the what-if mirror here, as $SLICESCHED_COST_MODEL does for the services
    # tests start (tests/conftest.py): the learned artifact is trained per machine, not in CI
    values: dict[str, Any] = {"admin_key": ADMIN, "executor_key": EXECUTOR, "neo4j": neo4j,
                              "lease_ttl_s": 2.0, "heartbeat_s": 0.5, "cost_model": "roofline"}
    values.update(overrides)
    return ServiceSettings(**values)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def reset_live_state(repo: Any) -> None:
    """A GMG without live tenants, executor pools, keys, projects, access requests, requests or leases
    (one service's world)."""
    for row in repo.live.live_tenants():
        repo.models.delete_tenant(row["tenant_id"])
    with repo.driver.session() as s:
        s.run("MATCH (n) WHERE n:Request OR (n:Slice AND n.live) OR n:ExecutorPool OR n:ApiKey OR n:Project "
              "OR n:AccessRequest DETACH DELETE n").consume()


@pytest.fixture(autouse=True)
def fresh_live_state(repo: Any) -> None:
    """Each test starts from a fresh live state (:func:`reset_live_state`)."""
    reset_live_state(repo)


@pytest.fixture
def make_client(neo4j: Neo4jSettings) -> Iterator[Callable[..., TestClient]]:
    opened: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        client = TestClient(create_app(settings(neo4j, **overrides)))
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for c in opened:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:8]


def new_tenant(client: TestClient, name: str, sla_class: str = "standard") -> str:
    r = client.post("/v1/tenants", json={"tenant_id": name, "sla_class": sla_class}, headers=auth(ADMIN))
    assert r.status_code == 201, r.text
    return str(r.json()["api_key"])


class Scripted:
    """A placement policy that decides what it is told once, then nothing (the real apply and
    audit paths run; the service's own scheduling loop may step it too)."""

    name = "scripted"

    def __init__(self, decision: Decision) -> None:
        self.decision: Decision | None = decision

    def step(self, now_s: float, state: ClusterView) -> Decision:
        decision, self.decision = self.decision or Decision(), None
        return decision


class FrozenWall:
    """The service's wall clock (key expiry, quota buckets) held still and moved by the test, so a
    check of "expired" or "refilled" depends on the time the test says passed, not on how long a
    loaded machine took between two calls."""

    def __init__(self, client: TestClient) -> None:
        self.state = client.app.state.service.state  # type: ignore[attr-defined]
        self.now = float(self.state.wall())
        self.state.wall = lambda: self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
