"""The managed Neo4j runs with authentication on: its password is generated on the first start
and kept readable by its owner only; a driver without it is refused."""

from __future__ import annotations

import pytest
from neo4j import GraphDatabase
from neo4j.exceptions import AuthError

from service.graph.connection import Neo4jSettings
from service.graph.local_server import LocalNeo4j

pytestmark = pytest.mark.neo4j


@pytest.fixture
def managed(neo4j: Neo4jSettings) -> LocalNeo4j:
    if neo4j.state_dir is None:
        pytest.skip("SLICESCHED_NEO4J_URI points at an external server")
    return LocalNeo4j(neo4j.state_dir)


def test_password_file_is_private(managed: LocalNeo4j) -> None:
    assert managed.password_path.stat().st_mode & 0o777 == 0o600
    assert managed.state_dir.stat().st_mode & 0o777 == 0o700
    user, password = managed.auth()
    assert user == "neo4j" and len(password) >= 24


def test_a_driver_without_the_password_is_refused(neo4j: Neo4jSettings, managed: LocalNeo4j) -> None:
    # Two wrong passwords at most: a third in a row would lock the user for a few seconds.
    for auth in (None, ("neo4j", "neo4j"), ("neo4j", "not-the-password")):
        with GraphDatabase.driver(neo4j.uri, auth=auth) as driver, pytest.raises(AuthError):
            driver.verify_connectivity()
    with GraphDatabase.driver(neo4j.uri, auth=managed.auth()) as driver:
        assert driver.execute_query("RETURN 1 AS one").records[0]["one"] == 1


def test_settings_resolve_the_managed_credentials(neo4j: Neo4jSettings, managed: LocalNeo4j) -> None:
    resolved = Neo4jSettings(state_dir=managed.state_dir).resolved(start=False)
    assert (resolved.uri, resolved.auth) == (neo4j.uri, managed.auth())
    assert resolved.env()["SLICESCHED_NEO4J_PASSWORD"] == managed.auth()[1]
