"""Shared fixtures. Integration tests run against the real Neo4j server, never a mock.

One managed server per test session (own free port, own data dir under pytest's tmp dir);
each test isolates itself by a fresh tenant id, so tests never share graph state. With
``SLICESCHED_NEO4J_URI`` set, tests use that server instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def data_absent(path: Path = SHARED_DATA) -> bool:
    """True where a test needing the public data may skip: the data is absent on a user's
    machine. In CI (``CI=true``) the data is always there, so such tests run and fail loudly."""
    return not path.exists() and os.environ.get("CI") != "true"


@pytest.fixture(scope="session")
def neo4j_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("SLICESCHED_NEO4J_URI"):
        yield os.environ["SLICESCHED_NEO4J_URI"]
        return
    from service.graph.local_server import LocalNeo4j

    server = LocalNeo4j(tmp_path_factory.mktemp("neo4j-state"), heap="512m", pagecache="128m")
    info = server.start(log=False)
    try:
        yield info.uri
    finally:
        server.stop()


@pytest.fixture(scope="session")
def driver(neo4j_uri: str) -> Iterator[object]:
    from neo4j import GraphDatabase

    user = os.environ.get("SLICESCHED_NEO4J_USER")
    auth = (user, os.environ.get("SLICESCHED_NEO4J_PASSWORD", "")) if user else None
    drv = GraphDatabase.driver(neo4j_uri, auth=auth)
    drv.verify_connectivity()
    yield drv
    drv.close()


@pytest.fixture(scope="session")
def repo(driver: object) -> object:
    from service.graph.repository import GraphRepository

    r = GraphRepository(driver)  # type: ignore[arg-type]
    r.apply_schema()
    return r


@pytest.fixture
def tenant() -> str:
    """A tenant id no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cluster_name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def shared_data() -> Path:
    if data_absent():
        pytest.skip(f"public data not found at {SHARED_DATA} (it is present in CI)")
    return SHARED_DATA
