"""Where the Neo4j server is, and opening a driver to it.

``SLICESCHED_NEO4J_URI`` (with ``SLICESCHED_NEO4J_USER`` / ``SLICESCHED_NEO4J_PASSWORD``)
points everything at an existing server, e.g. ``neo4j:5.26-community`` under Docker. Without
it the managed local server (:mod:`service.graph.local_server`) is used, started on demand,
with its own generated password (``SLICESCHED_NEO4J_PASSWORD`` if set).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from neo4j import Driver, GraphDatabase

from service import environment as env
from service.domain.error import Neo4jServerError
from service.graph.local_server import LocalNeo4j


@dataclass(frozen=True)
class Neo4jSettings:
    uri: str | None = None
    user: str | None = None
    password: str | None = None
    database: str = "neo4j"
    state_dir: Path | None = None  # managed server's state dir when ``uri`` is None

    @staticmethod
    def from_env() -> Neo4jSettings:
        state = env.path("SLICESCHED_STATE")
        return Neo4jSettings(
            uri=env.raw("SLICESCHED_NEO4J_URI"),
            user=env.raw("SLICESCHED_NEO4J_USER"),
            password=env.raw("SLICESCHED_NEO4J_PASSWORD"),
            database=env.text("SLICESCHED_NEO4J_DATABASE") or "neo4j",
            state_dir=state / "neo4j" if state else None,
        )

    @property
    def managed(self) -> bool:
        return self.uri is None

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.user, self.password or "") if self.user else None

    def resolved(self, *, start: bool = True) -> Neo4jSettings:
        """These settings with the URI and credentials filled in: for the managed server, its
        Bolt URI (started if needed and ``start`` is true) and its user and password."""
        if self.uri:
            return self
        server = LocalNeo4j(self.state_dir)
        info = server.start() if start else server.status()
        if info is None:
            raise Neo4jServerError("the managed Neo4j is not running: run 'slicesched neo4j start'")
        user, password = server.auth()
        return replace(self, uri=info.uri, user=user, password=password)

    def env(self) -> dict[str, str]:
        """The ``SLICESCHED_NEO4J_*`` variables that point a child process at this server
        (call on :meth:`resolved` settings)."""
        assert self.uri, "resolve the settings first"
        out = {"SLICESCHED_NEO4J_URI": self.uri, "SLICESCHED_NEO4J_DATABASE": self.database}
        if self.user:
            out |= {"SLICESCHED_NEO4J_USER": self.user, "SLICESCHED_NEO4J_PASSWORD": self.password or ""}
        return out


def resolve_uri(settings: Neo4jSettings, *, start: bool = True) -> str:
    """The Bolt URI to use; starts the managed server if needed and ``start`` is true. The
    managed server's URI is read from its state dir each time (a restart may change its port)."""
    uri = settings.resolved(start=start).uri
    assert uri is not None
    return uri


def open_driver(settings: Neo4jSettings, *, start: bool = True, **config: Any) -> Driver:
    """A verified driver; ``config`` goes to the driver (timeouts)."""
    resolved = settings.resolved(start=start)
    assert resolved.uri is not None
    # Notifications ("property key does not exist" on a young graph) are noise for a service.
    driver = GraphDatabase.driver(resolved.uri, auth=resolved.auth, notifications_min_severity="OFF", **config)
    driver.verify_connectivity()
    return driver
