"""Inspection's bounds in the graph layer, on the real server: a transaction timeout that stops the
query in Neo4j (not only the caller's wait), and a row cap that keeps the first rows and says so."""

from __future__ import annotations

import pytest

from service.domain.error import InvalidInputError
from service.graph.repository import GraphRepository

SLOW = "UNWIND range(1, 2000000000) AS x WITH x WHERE x = -1 RETURN count(x) AS n"


def test_a_query_past_its_timeout_is_stopped_in_the_server(repo: GraphRepository) -> None:
    with pytest.raises(InvalidInputError, match=r"ran past the inspection bound \(0.5 s\) and was stopped in Neo4j"):
        repo.inspection.run_read(SLOW, timeout_s=0.5)  # the server's own TransactionTimedOut: it stopped the query


def test_rows_past_the_cap_are_dropped_and_flagged(repo: GraphRepository) -> None:
    table = repo.inspection.run_read("UNWIND range(1, 50) AS x RETURN x", max_rows=10)
    assert table.rows == [[x] for x in range(1, 11)] and table.truncated
    table = repo.inspection.run_read("UNWIND range(1, 50) AS x RETURN x", max_rows=50)
    assert len(table.rows) == 50 and not table.truncated
    table = repo.inspection.run_named("my_requests", {"tenant_id": "nobody"}, max_rows=0)
    assert table.columns and table.rows == [] and not table.truncated  # no row was dropped
