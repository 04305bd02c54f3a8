"""The HTTP layer goes through the live service's facade: routers and their helpers never reach
into the service's in-memory state, its repository, its Neo4j gate's raw calls or its GMG writer
(the issue "A house you can live in": ``service/api`` is HTTP only, "through one facade of
live"). They read through ``svc.reads`` (:class:`service.live.reads.LiveReads`) and act through
the service's own methods."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
HTTP_LAYER = (SERVICE / "api", SERVICE / "webconsole")  # the api room (docs/ARCHITECTURE.md)
SERVICE_NAMES = {"svc", "service"}  # what the routers call the LiveService they are given
INTERNALS = {"state", "repo", "db", "writer", "driver", "registry", "book"}


def reaches(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, "svc.state")`` for every attribute of an internal read off a service name."""
    return sorted((node.lineno, f"{node.value.id}.{node.attr}") for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in SERVICE_NAMES and node.attr in INTERNALS)


def test_the_http_layer_reaches_no_internal_of_the_service() -> None:
    paths = sorted(path for room in HTTP_LAYER for path in room.rglob("*.py"))
    assert len(paths) > 20  # the rooms are where the test thinks they are
    found = {str(path.relative_to(SERVICE.parent)): hits for path in paths
             if (hits := reaches(ast.parse(path.read_text(), str(path))))}
    assert found == {}, f"service/api reaches past the facade (use svc.reads or a service method): {found}"


def test_the_check_sees_a_reach() -> None:
    """The scan is not vacuous: it finds the reaches it forbids, and not look-alikes."""
    tree = ast.parse("x = svc.state.tenants\ny = service.repo\nz = request.app.state.service\nw = svc.reads.wall()")
    assert reaches(tree) == [(1, "svc.state"), (2, "service.repo")]
