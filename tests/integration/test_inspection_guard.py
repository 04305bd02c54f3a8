"""Inspection Cypher on the real server: LOAD CSV, procedures and administration commands are
refused by the text check and, independently, by the check of the server's own plan; nothing is
fetched or run; allowed reads and every named inspection query still work."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import neo4j
import pytest

from service.domain.error import ReadOnlyViolationError
from service.graph import guard
from service.graph.connection import Neo4jSettings
from service.graph.repository import GraphRepository

pytestmark = pytest.mark.neo4j


@pytest.fixture
def web() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that records every path asked of it."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"secret,data\n1,2\n"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()


def refused_queries(url: str) -> dict[str, str]:
    return {
        f"LOAD CSV FROM '{url}/a.csv' AS row RETURN row": "LOAD CSV",
        f"MATCH (n) WITH count(n) AS c LOAD/**/CSV FROM '{url}/b.csv' AS row RETURN row": "LOAD CSV",
        "TERMINATE TRANSACTIONS 'neo4j-transaction-1'": "Terminate",
        "SHOW TRANSACTIONS": "ShowTransactions",
        "CALL db.clearQueryCaches()": "db.clearQueryCaches",
        "CALL dbms.listConfig()": "dbms.listConfig",
        "call dbms.listConfig() yield name return name": "dbms.listConfig",
        "RETURN 1 AS x UNION // c\nCALL dbms.components() YIELD name RETURN name AS x": "dbms.components",
        "SHOW SETTINGS": "ShowSettings",
        "SHOW USERS": "system",
    }


def test_refused_by_text_and_by_plan(repo: GraphRepository, driver: Any, web: tuple[str, list[str]]) -> None:
    url, hits = web
    for query, what in refused_queries(url).items():
        with pytest.raises(ReadOnlyViolationError, match="inspection refused"):
            repo.inspection.run_read(query)
        # The plan check alone (the text check bypassed): the server's EXPLAIN of the same query.
        with driver.session(default_access_mode=neo4j.READ_ACCESS) as s:
            plan = s.execute_read(lambda tx, q=query: tx.run("EXPLAIN " + q).consume().plan)
        with pytest.raises(ReadOnlyViolationError, match=what):
            guard.check_plan(plan, "neo4j")
    assert hits == []  # nothing was fetched, not even by EXPLAIN


def test_allowed_reads_still_work(repo: GraphRepository, tenant: str) -> None:
    repo.models.upsert_tenant(tenant, note="LOAD CSV FROM 'http://x' // CALL dbms.listConfig()")
    table = repo.inspection.run_read("MATCH (t:Tenant {tenant_id: $t}) WHERE t.note CONTAINS 'LOAD CSV' /* SHOW TRANSACTIONS */ "
                          "RETURN t.note AS note", {"t": tenant})
    assert table.rows == [["LOAD CSV FROM 'http://x' // CALL dbms.listConfig()"]]
    assert "Tenant" in {r[0] for r in repo.inspection.run_read("CALL db.labels() YIELD label RETURN label").rows}
    assert "tenant_id" in {r[0] for r in repo.inspection.run_read("SHOW CONSTRAINTS YIELD name RETURN name").rows}
    assert repo.inspection.run_read("SHOW INDEXES").rows
    assert repo.inspection.run_read("MATCH (t:Tenant {tenant_id: $t}) CALL { WITH t RETURN t.tenant_id AS id } RETURN id",
                         {"t": tenant}).rows == [[tenant]]
    assert repo.inspection.run_read("EXPLAIN MATCH (n) RETURN n").rows == []


def test_every_named_inspection_query_passes_the_guard(repo: GraphRepository) -> None:
    samples = {"tenant_id": "nobody", "model_id": "m", "phase": "prefill", "op_id": "x", "limit": 1,
               "since": 0.0, "stale_before": 0.0, "device_id": "nowhere", "since_s": 0.0,
               "filters": {"action": "tenant"}, "projects": ["default"]}
    for q in repo.inspection.inspection_queries():
        table = repo.inspection.run_named(q.name, {p: samples[p] for p in q.params})
        assert table.columns, q.name


def test_cli_refuses_with_exit_code_2(neo4j: Neo4jSettings, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import main

    for key, value in neo4j.env().items():
        monkeypatch.setenv(key, value)
    for query in ("CALL dbms.listConfig()", "SHOW TRANSACTIONS", "TERMINATE TRANSACTIONS 'neo4j-transaction-1'"):
        assert main(["cypher", query]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: inspection refused") and err.count("\n") == 1
    assert main(["cypher", "--json", "CALL db.labels() YIELD label RETURN count(label) AS n"]) == 0
