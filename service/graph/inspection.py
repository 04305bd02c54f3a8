"""Ad-hoc and named inspection of the GMG: read transactions on a read-mode session, so the
server itself refuses a write, and only after :mod:`service.graph.guard` passed both the query's
text and the server's ``EXPLAIN`` plan of it (no ``LOAD CSV``, procedures outside an allow-list
or administration commands)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import neo4j
from neo4j import ManagedTransaction
from neo4j.exceptions import ClientError, CypherSyntaxError, DatabaseError

from service.domain.error import InvalidInputError, ReadOnlyViolationError
from service.graph import guard
from service.graph.catalog import Query
from service.graph.store import GraphStore


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[Any]]


def _plain(value: Any) -> Any:
    """Neo4j values to plain Python for printing and JSON."""
    if isinstance(value, neo4j.graph.Node):
        return {"labels": sorted(value.labels), **_plain(dict(value))}
    if isinstance(value, neo4j.graph.Relationship):
        return {"type": value.type, **_plain(dict(value))}
    if isinstance(value, neo4j.graph.Path):
        return [_plain(n) for n in value.nodes]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "iso_format"):
        return value.iso_format()
    return value


class Inspection(GraphStore):
    QUERIES: tuple[str, ...] = ("reconciliation_violations",)

    def run_read(self, text: str, params: Mapping[str, Any] | None = None) -> Table:
        """Run arbitrary Cypher in a read transaction; a write is refused by the server, and
        ``LOAD CSV``, procedures and administration commands outside the allow-list of
        :mod:`service.graph.guard` by its two checks (the text, then the server's plan of it, in
        the same transaction) with :class:`ReadOnlyViolationError`."""
        statement = guard.check_text(text)

        def work(tx: ManagedTransaction) -> Table:
            plan = tx.run("EXPLAIN " + text[statement:], dict(params or {})).consume().plan
            guard.check_plan(plan, self.database)
            result = tx.run(text, dict(params or {}))
            rows = [[_plain(v) for v in r.values()] for r in result]
            return Table(list(result.keys()), rows)

        try:
            with self.driver.session(database=self.database, default_access_mode=neo4j.READ_ACCESS) as s:
                return s.execute_read(work)
        except CypherSyntaxError as exc:
            raise InvalidInputError(f"Cypher syntax error: {exc.message}") from None
        except DatabaseError as exc:  # the server failed on this query (not on the connection)
            raise InvalidInputError(f"query failed in the server: {exc.message}") from None
        except ClientError as exc:
            code = exc.code or ""
            if "AccessMode" in code or "ForbiddenDueToTransactionType" in code or "WriteOnReadOnly" in code:
                raise ReadOnlyViolationError(
                    "inspection is read-only: this query writes to the graph and was refused by the server"
                ) from None
            raise InvalidInputError(f"query failed: {exc.message}") from None

    def run_named(self, name: str, params: Mapping[str, Any] | None = None) -> Table:
        """Run a named inspection query (``cypher/inspect/NAME.cypher``)."""
        q = self.catalog.get(name)
        if q.category != "inspect":
            raise InvalidInputError(f"{name!r} is not an inspection query "
                                    f"(available: {', '.join(self.inspection_names())})")
        return self.run_read(q.text, q.bind(params or {}))

    def inspection_names(self) -> list[str]:
        return sorted(q.name for q in self.catalog.by_category("inspect"))

    def inspection_queries(self) -> Iterable[Query]:
        return sorted(self.catalog.by_category("inspect"), key=lambda q: q.name)
