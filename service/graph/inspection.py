"""Ad-hoc and named inspection of the GMG: read transactions on a read-mode session, so the
server itself refuses a write, and only after :mod:`service.graph.guard` passed both the query's
text and the server's ``EXPLAIN`` plan of it (no ``LOAD CSV``, procedures outside an allow-list
or administration commands)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import neo4j
from neo4j import ManagedTransaction
from neo4j.exceptions import ClientError, CypherSyntaxError, DatabaseError, TransientError

from service.domain.error import InvalidInputError, ReadOnlyViolationError
from service.domain.table import Table
from service.graph import guard
from service.graph.catalog import Query
from service.graph.store import StorePart


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


class Inspection(StorePart):
    QUERIES: tuple[str, ...] = ("reconciliation_violations",)

    def run_read(self, text: str, params: Mapping[str, Any] | None = None, *, timeout_s: float | None = None,
                 max_rows: int | None = None) -> Table:
        """Run arbitrary Cypher in a read transaction; a write is refused by the server, and
        ``LOAD CSV``, procedures and administration commands outside the allow-list of
        :mod:`service.graph.guard` by its two checks (the text, then the server's plan of it, in
        the same transaction) with :class:`ReadOnlyViolationError`. ``timeout_s``: the server stops
        the transaction past it (:class:`InvalidInputError` naming the bound; None: the server's
        own limit); ``max_rows``: rows kept at most, the rest discarded unread (``truncated``)."""
        statement = guard.check_text(text)

        @neo4j.unit_of_work(timeout=timeout_s)
        def work(tx: ManagedTransaction) -> Table:
            plan = tx.run("EXPLAIN " + text[statement:], dict(params or {})).consume().plan
            guard.check_plan(plan, self.database)
            result = tx.run(text, dict(params or {}))
            rows: list[list[Any]] = []
            truncated = False
            for record in result:
                if max_rows is not None and len(rows) >= max_rows:
                    truncated = True
                    break
                rows.append([_plain(v) for v in record.values()])
            keys = list(result.keys())
            result.consume()  # the rest discarded in the server, not fetched
            return Table(keys, rows, truncated)

        try:
            with self.driver.session(database=self.database, default_access_mode=neo4j.READ_ACCESS) as s:
                return s.execute_read(work)
        except CypherSyntaxError as exc:
            raise InvalidInputError(f"Cypher syntax error: {exc.message}") from None
        except DatabaseError as exc:  # the server failed on this query (not on the connection)
            raise InvalidInputError(f"query failed in the server: {exc.message}") from None
        except (ClientError, TransientError) as exc:
            code = exc.code or ""
            if "TransactionTimedOut" in code:
                bound = f"the inspection bound ({timeout_s:g} s)" if timeout_s else "the server's transaction timeout"
                raise InvalidInputError(
                    f"the query ran past {bound} and was stopped in Neo4j; narrow it "
                    "(a LIMIT, a tenant or time filter) or run it on a copy of the database") from None
            if isinstance(exc, TransientError):
                raise
            if "AccessMode" in code or "ForbiddenDueToTransactionType" in code or "WriteOnReadOnly" in code:
                raise ReadOnlyViolationError(
                    "inspection is read-only: this query writes to the graph and was refused by the server"
                ) from None
            raise InvalidInputError(f"query failed: {exc.message}") from None

    def run_named(self, name: str, params: Mapping[str, Any] | None = None, *, timeout_s: float | None = None,
                  max_rows: int | None = None) -> Table:
        """Run a named inspection query (``cypher/inspect/NAME.cypher``; the bounds: :meth:`run_read`)."""
        q = self.catalog.get(name)
        if q.category != "inspect":
            raise InvalidInputError(f"{name!r} is not an inspection query "
                                    f"(available: {', '.join(self.inspection_names())})")
        return self.run_read(q.text, q.bind(params or {}), timeout_s=timeout_s, max_rows=max_rows)

    def inspection_names(self) -> list[str]:
        return sorted(q.name for q in self.catalog.by_category("inspect"))

    def inspection_queries(self) -> Iterable[Query]:
        return sorted(self.catalog.by_category("inspect"), key=lambda q: q.name)
