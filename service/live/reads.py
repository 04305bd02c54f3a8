"""What the HTTP layer may read of the live service: :class:`LiveReads`, the read half of the
facade :mod:`service.api` goes through (the write half is the service's own methods: accept,
complete, renew, heartbeat, set the queue policy, ...).

The routers never reach into the service's state, repository, Neo4j gate or GMG writer: they ask
this object (a test in tests/unit/test_api_facade.py holds them to it). Reads of the in-memory
mirror answer at once from the event loop; reads of the stores run in a worker thread through
the gate, failing fast (503) while Neo4j is down. Not found is :class:`NotFoundError` (404),
whether the thing does not exist or belongs to another tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from service.domain.error import DatabaseUnavailableError, InspectionBusyError
from service.domain.table import Table

if TYPE_CHECKING:
    from service.graph.catalog import Query
    from service.graph.repository import GraphRepository
    from service.live.records import LiveModel, LiveReplica, LiveRequest, LiveTenant
    from service.live.state import LiveState
    from service.live.writer import GmgWriter


class Gate(Protocol):
    """The Neo4j gate (:class:`~service.live.neo4j_gate.Neo4jGate`): bounded calls into the stores."""

    @property
    def repo(self) -> GraphRepository | None: ...

    @property
    def writer(self) -> GmgWriter | None: ...

    async def db(self, fn: Any, *args: Any, bound_s: float | None = -1.0, read: bool = False,
                 done: Callable[[], None] | None = None, **kwargs: Any) -> Any: ...


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (nearest rank, no interpolation); None when empty."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


GRACE_S = 2.0  # the caller waits this much past the inspection's timeout, for Neo4j's own answer to it


class LiveReads:
    """``state``: the in-memory mirror; ``gate``: the stores behind Neo4j (its ``repo`` is set at
    the service's start: a store read before then is a 503, as while Neo4j is down).

    Inspection (ad-hoc and named queries, audit pages and verification) is bounded three ways, so
    that it cannot starve the lease path, whose calls share the worker threads and the driver's
    connections: at most ``max_inspections`` run at once (one more is a 429 at once, counted until
    its thread ends, not until its caller stops waiting); each query's transaction is stopped in
    Neo4j past ``inspect_timeout_s``; an answer holds at most ``inspect_max_rows`` rows."""

    def __init__(self, state: LiveState, gate: Gate, *, inspect_timeout_s: float = 30.0, max_inspections: int = 2,
                 inspect_max_rows: int = 10_000) -> None:
        self.state = state
        self.gate = gate
        self.inspect_timeout_s = inspect_timeout_s
        self.max_inspections = max_inspections
        self.inspect_max_rows = inspect_max_rows
        self.inspections = 0  # running now (their threads)

    # ---- the in-memory mirror --------------------------------------------------------------------
    def wall(self) -> float:
        """The service's clock in epoch seconds (key expiry and quota meters read the same one)."""
        return self.state.wall()

    def tenant(self, tenant_id: str) -> LiveTenant:
        return self.state.tenant(tenant_id)

    def tenant_ids(self) -> list[str]:
        return sorted(self.state.tenants)

    def models(self, tenant_id: str | None = None) -> list[LiveModel]:
        """Every model (a tenant's only, given one), by uid."""
        return sorted((m for m in self.state.models.values() if tenant_id is None or m.tenant_id == tenant_id),
                      key=lambda m: m.uid)

    def model(self, tenant_id: str, model_id: str) -> LiveModel:
        return self.state.model(tenant_id, model_id)

    def model_by_uid(self, uid: str) -> LiveModel | None:
        """The model ``tenant_id/model_id``, or None."""
        return self.state.models.get(uid)

    def replicas(self) -> list[LiveReplica]:
        return list(self.state.replicas.values())

    def serving(self, model_uid: str) -> bool:
        """Whether a replica that is not draining serves the model now."""
        return any(r.model_uid == model_uid and not r.draining for r in self.state.replicas.values())

    def devices(self) -> list[tuple[Any, int, list[str]]]:
        """``(device, free bytes, replica ids on it)`` for every device, by device id."""
        s = self.state
        return [(d, s.free_bytes(d.device_id),
                 sorted(r.replica_id for r in s.replicas.values() if d.device_id in r.device_ids))
                for d in sorted(s.devices.values(), key=lambda d: d.device_id)]

    def request(self, request_id: str, tenant_id: str | None) -> LiveRequest:
        """The request, if it is ``tenant_id``'s (None: any tenant's)."""
        return self.state.request(request_id, tenant_id)

    def requests(self) -> Iterable[LiveRequest]:
        """Every request the service holds, oldest first."""
        return self.state.requests.values()

    def queue_policy_name(self) -> str:
        return self.state.policy.name

    def counters(self) -> dict[str, int]:
        return dict(self.state.counters)

    def iteration_s(self) -> Any:
        return self.state.iteration_s

    def token_budget_errors(self) -> list[float]:
        return list(self.state.calibrator.abs_errors)

    def gmg_writes(self) -> dict[str, Any]:
        """The GMG writer's lag percentiles (seconds from a change to its commit), rows written and
        rows pending (zeros before the service's start opened it)."""
        writer = self.gate.writer
        lags = sorted(writer.lags_s) if writer else []
        return {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99),
                "rows": writer.rows_written if writer else 0, "pending": writer.pending if writer else 0}

    # ---- the stores --------------------------------------------------------------------------------
    def _repo(self) -> GraphRepository:
        if self.gate.repo is None:
            raise DatabaseUnavailableError("the service is starting: its stores are not open yet")
        return self.gate.repo

    async def _inspection(self, fn: Any, *args: Any, bound_s: float | None, **kwargs: Any) -> Any:
        """``fn`` within the inspection budget (:class:`InspectionBusyError` when it is spent)."""
        if self.inspections >= self.max_inspections:
            raise InspectionBusyError(f"{self.inspections} inspection queries are running, as many as may run at "
                                      f"once (SLICESCHED_MAX_INSPECTIONS); nothing ran: ask again in a moment")
        self.inspections += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.inspections -= 1

        return await self.gate.db(fn, *args, bound_s=bound_s, read=True, done=release, **kwargs)

    async def audit_log(self, **filters: Any) -> list[dict[str, Any]]:
        """Audit entries matching every filter (:meth:`AuditStore.audit_log`), oldest first."""
        rows: list[dict[str, Any]] = await self._inspection(self._repo().audit.audit_log, **filters,
                                                            bound_s=self.inspect_timeout_s + GRACE_S)
        return rows

    async def verify_audit(self, anchor: tuple[int, str] | None) -> Any:
        """The whole chain walked and checked (no time bound: it grows with the log)."""
        return await self._inspection(self._repo().audit.verify_audit, anchor=anchor, bound_s=None)

    async def experiment(self, uid: str) -> Any:
        """The experiment record ``uid`` (:class:`NotFoundError` when absent)."""
        return await self.gate.db(self._repo().experiments.get_experiment, uid)

    async def experiments(self, **filters: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self.gate.db(self._repo().experiments.list_experiments, **filters)
        return rows

    def named_query(self, name: str) -> Query:
        """The catalog's query ``name`` (:class:`NotFoundError` when unknown)."""
        return self._repo().catalog.get(name)

    def inspection_queries(self) -> list[Query]:
        return list(self._repo().inspection.inspection_queries())

    async def run_read(self, query: str, params: dict[str, Any]) -> Table:
        """Read-only Cypher (refused when it writes), its values as parameters, within the
        inspection's bounds (the class's docstring)."""
        table: Table = await self._inspection(self._repo().inspection.run_read, query, params, **self._bounds())
        return table

    async def run_named(self, name: str, params: dict[str, Any]) -> Table:
        table: Table = await self._inspection(self._repo().inspection.run_named, name, params, **self._bounds())
        return table

    def _bounds(self) -> dict[str, Any]:
        return {"timeout_s": self.inspect_timeout_s, "max_rows": self.inspect_max_rows,
                "bound_s": self.inspect_timeout_s + GRACE_S}
