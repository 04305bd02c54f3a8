"""The GMG store's plumbing: catalog queries run with checked parameters in managed
transactions, the schema, and the id rules every part of :class:`~service.graph.repository.GraphRepository`
shares."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import neo4j
from neo4j import Driver, ManagedTransaction

from service.domain.error import InvalidInputError
from service.graph.catalog import Query, QueryCatalog

T = TypeVar("T")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def check_id(kind: str, value: str) -> str:
    """Tenant and model ids become parts of uids: keep them short and free of '/'."""
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidInputError(
            f"invalid {kind} id {value!r}: use 1-64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit",
            culprit=str(value),
        )
    return value


def model_uid(tenant_id: str, model_id: str) -> str:
    return f"{check_id('tenant', tenant_id)}/{check_id('model', model_id)}"


class WriteFence(Protocol):
    """Checked at the end of every write transaction, inside it: raises to refuse (roll back) the
    write (:class:`service.live.leader.Leadership`: the writer no longer leads)."""

    def check(self, tx: ManagedTransaction) -> None: ...


class GraphStore:
    """Runs catalog queries by name; ``REQUIRED``: the queries the whole repository needs,
    checked against the catalog when it is built. Every write transaction goes through
    :meth:`_execute_write`, which runs :attr:`fence` (when set) at its end, in the same transaction."""

    QUERIES: tuple[str, ...] = ("constraints", "indexes", "refresh_busy_windows")
    REQUIRED: tuple[str, ...] = QUERIES

    def __init__(self, driver: Driver, catalog: QueryCatalog | None = None, *, database: str = "neo4j") -> None:
        self.driver = driver
        self.catalog = catalog or QueryCatalog.load()
        self.catalog.require(self.REQUIRED)
        self.database = database
        self.fence: WriteFence | None = None

    def _execute_write(self, work: Callable[[ManagedTransaction], T]) -> T:
        """``work`` in a managed write transaction (retried on transient errors), then the
        :attr:`fence`'s check in the same transaction."""
        fence = self.fence

        def fenced(tx: ManagedTransaction) -> T:
            out = work(tx)
            if fence is not None:  # at the end: a takeover committed while the work ran is seen
                fence.check(tx)
            return out

        with self.driver.session(database=self.database) as s:
            return s.execute_write(fenced)

    def _q(self, name: str, params: Mapping[str, Any]) -> tuple[Query, dict[str, Any]]:
        q = self.catalog.get(name)
        return q, q.bind(params)

    def _tx_run(self, tx: ManagedTransaction, name: str, **params: Any) -> list[dict[str, Any]]:
        q, p = self._q(name, params)
        return [r.data() for r in tx.run(q.text, p)]

    def _write(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self._execute_write(lambda tx: self._tx_run(tx, name, **params))

    def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        with self.driver.session(database=self.database, default_access_mode=neo4j.READ_ACCESS) as s:
            return s.execute_read(lambda tx: self._tx_run(tx, name, **params))

    def _tx_refresh_busy_windows(self, tx: ManagedTransaction, touched: Iterable[Sequence[Any]]) -> None:
        """Bring the busy windows cached on devices up to date after a slice write, in the write's
        own transaction (so the candidate-slot search never reads a stale cache): ``touched``
        holds the ``[device_id, slice uid]`` pairs the write answered (a null device: none)."""
        by_device: dict[str, set[str]] = {}
        for device_id, slice_uid in touched:
            if device_id is not None:
                by_device.setdefault(str(device_id), set()).add(str(slice_uid))
        if by_device:
            self._tx_run(tx, "refresh_busy_windows", devices=[
                {"device_id": d, "slice_uids": sorted(uids)} for d, uids in sorted(by_device.items())])

    def _write_slices(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Run a slice write whose answer names the ``[device_id, slice uid]`` pairs it
        ``touched``, and refresh those busy windows in the same transaction."""
        def work(tx: ManagedTransaction) -> list[dict[str, Any]]:
            out = self._tx_run(tx, name, **params)
            self._tx_refresh_busy_windows(tx, out[0]["touched"] if out else ())
            return out

        return self._execute_write(work)

    # ---- schema --------------------------------------------------------------------------------------
    def apply_schema(self) -> int:
        """Create constraints and indexes if absent; returns the number of statements run."""
        n = 0
        with self.driver.session(database=self.database) as s:
            for q in self.catalog.by_category("schema"):
                for stmt in q.statements:
                    s.run(stmt).consume()
                    n += 1
            s.run("CALL db.awaitIndexes(300)").consume()
        return n


class StorePart:
    """One part of :class:`~service.graph.repository.GraphRepository` (models, cluster, slots, live
    records...): its queries run through the repository's plumbing (:class:`GraphStore`: one driver,
    one catalog, one write fence), held as an attribute of the repository, not a base of it."""

    QUERIES: tuple[str, ...] = ()  # the catalog queries this part runs

    def __init__(self, store: GraphStore) -> None:
        self.store = store

    @property
    def driver(self) -> Driver:
        return self.store.driver

    @property
    def database(self) -> str:
        return self.store.database

    @property
    def catalog(self) -> QueryCatalog:
        return self.store.catalog

    def _execute_write(self, work: Callable[[ManagedTransaction], T]) -> T:
        return self.store._execute_write(work)

    def _q(self, name: str, params: Mapping[str, Any]) -> tuple[Query, dict[str, Any]]:
        return self.store._q(name, params)

    def _tx_run(self, tx: ManagedTransaction, name: str, **params: Any) -> list[dict[str, Any]]:
        return self.store._tx_run(tx, name, **params)

    def _write(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self.store._write(name, **params)

    def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self.store._read(name, **params)

    def _write_slices(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self.store._write_slices(name, **params)

    def _tx_refresh_busy_windows(self, tx: ManagedTransaction, touched: Iterable[Sequence[Any]]) -> None:
        self.store._tx_refresh_busy_windows(tx, touched)
