"""The query catalog: one query per file, parameters declared, missing queries caught at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.domain.error import CatalogError, NotFoundError
from service.graph.catalog import QueryCatalog, parse_query
from service.graph.repository import GraphRepository


def test_the_shipped_catalog_is_complete_and_declares_its_parameters() -> None:
    catalog = QueryCatalog.load()
    catalog.require(GraphRepository.REQUIRED)
    inspect = {q.name for q in catalog.by_category("inspect")}
    assert {"devices_headroom", "shared_devices", "dependency_chain", "heaviest_operators"} <= inspect
    assert all(q.description for q in catalog.by_category("inspect"))
    assert catalog.get("upsert_devices").params == ("cluster", "rows")
    assert len(catalog.get("constraints").statements) >= 6


def test_undeclared_and_unused_parameters_fail_loading() -> None:
    with pytest.raises(CatalogError, match=r"undeclared parameters \['\$limit'\]"):
        parse_query("q", "read", "// @param id: x\nMATCH (n {id: $id}) RETURN n LIMIT $limit")
    with pytest.raises(CatalogError, match="never uses"):
        parse_query("q", "read", "// @param id: x\n// @param extra: y\nMATCH (n {id: $id}) RETURN n")
    # A dollar inside a string literal or a comment is not a parameter.
    q = parse_query("q", "read", "// @param id: x\nMATCH (n {id: $id}) // not $this\nRETURN '$literal' AS s")
    assert q.params == ("id",)


def test_a_missing_query_fails_at_start(tmp_path: Path) -> None:
    (tmp_path / "read").mkdir()
    (tmp_path / "read" / "only.cypher").write_text("// one\nRETURN 1")
    catalog = QueryCatalog.load(tmp_path)  # type: ignore[arg-type]
    with pytest.raises(CatalogError, match="lacks"):
        GraphRepository(driver=None, catalog=catalog)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        catalog.get("nope")


def test_duplicate_names_fail(tmp_path: Path) -> None:
    for folder in ("read", "write"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.cypher").write_text("RETURN 1")
    with pytest.raises(CatalogError, match="two queries"):
        QueryCatalog.load(tmp_path)  # type: ignore[arg-type]


def test_supplied_parameters_are_checked_before_running() -> None:
    q = QueryCatalog.load().get("upsert_tenant")
    with pytest.raises(CatalogError, match="missing"):
        q.check_params({"tenant_id": "a"})
    with pytest.raises(CatalogError, match="undeclared"):
        q.check_params({"tenant_id": "a", "props": {}, "sneaky": 1})


def test_an_optional_parameter_may_be_left_out_and_reaches_the_server_as_null(tmp_path: Path) -> None:
    (tmp_path / "inspect").mkdir()
    (tmp_path / "inspect" / "q.cypher").write_text(
        "// @param tenant_id: the tenant\n// @param projects?: these projects, or null\n"
        "MATCH (r:Request {tenant_id: $tenant_id}) WHERE $projects IS NULL OR r.project_id IN $projects RETURN r\n")
    q = QueryCatalog.load(tmp_path).get("q")
    assert q.params == ("tenant_id", "projects") and q.optional == {"projects"}
    assert q.bind({"tenant_id": "a"}) == {"tenant_id": "a", "projects": None}
    assert q.bind({"tenant_id": "a", "projects": ["p"]}) == {"tenant_id": "a", "projects": ["p"]}
    with pytest.raises(CatalogError, match="missing"):
        q.bind({"projects": None})
