"""Where the Neo4j server is, and opening a driver to it.

``SLICESCHED_NEO4J_URI`` (with ``SLICESCHED_NEO4J_USER`` / ``SLICESCHED_NEO4J_PASSWORD``)
points everything at an existing server, e.g. ``neo4j:5.26-community`` under Docker. Without
it the managed local server (:mod:`service.graph.local_server`) is used, started on demand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

from neo4j import Driver, GraphDatabase

from service.graph.local_server import LocalNeo4j, Neo4jServerError


@dataclass(frozen=True)
class Neo4jSettings:
    uri: str | None = None
    user: str | None = None
    password: str | None = None
    database: str = "neo4j"
    state_dir: Path | None = None  # managed server's state dir when ``uri`` is None

    @staticmethod
    def from_env() -> Neo4jSettings:
        state = os.environ.get("SLICESCHED_STATE")
        return Neo4jSettings(
            uri=os.environ.get("SLICESCHED_NEO4J_URI") or None,
            user=os.environ.get("SLICESCHED_NEO4J_USER") or None,
            password=os.environ.get("SLICESCHED_NEO4J_PASSWORD") or None,
            database=os.environ.get("SLICESCHED_NEO4J_DATABASE", "neo4j"),
            state_dir=Path(state) / "neo4j" if state else None,
        )

    @property
    def managed(self) -> bool:
        return self.uri is None


@overload
def resolve_uri(settings: Neo4jSettings, *, start: bool = True, missing_ok: Literal[False] = False) -> str: ...
@overload
def resolve_uri(settings: Neo4jSettings, *, start: bool = True, missing_ok: bool) -> str | None: ...
def resolve_uri(settings: Neo4jSettings, *, start: bool = True, missing_ok: bool = False) -> str | None:
    """The Bolt URI to use; starts the managed server if needed and ``start`` is true. The
    managed server's URI is read from its state dir each time (a restart may change its port);
    with ``missing_ok`` a managed server that is not running gives None."""
    if settings.uri:
        return settings.uri
    server = LocalNeo4j(settings.state_dir)
    info = server.status() if not start else server.start()
    if info is None:
        if missing_ok:
            return None
        raise Neo4jServerError("the managed Neo4j is not running: run 'slicesched neo4j start'")
    return info.uri


def open_driver(settings: Neo4jSettings, *, start: bool = True, uri: str | None = None, **config: Any) -> Driver:
    """A verified driver; ``config`` goes to the driver (timeouts)."""
    uri = uri or resolve_uri(settings, start=start)
    auth = (settings.user, settings.password or "") if settings.user else None
    # Notifications ("property key does not exist" on a young graph) are noise for a service.
    driver = GraphDatabase.driver(uri, auth=auth, notifications_min_severity="OFF", **config)
    driver.verify_connectivity()
    return driver
