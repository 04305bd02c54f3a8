"""The GMG repository: every read and write of the Global Mapping Graph goes through here.

Each public method runs catalog queries of the same name (``import_model`` is a composition of
several, in one transaction). Values reach Cypher only as parameters; writes go in batches of
``UNWIND $rows``. Inspection runs in read transactions on a read-mode session, so the server
itself refuses a write, and only after :mod:`service.graph.guard` passed both the query's text
and the server's ``EXPLAIN`` plan of it (no ``LOAD CSV``, procedures outside an allow-list or
administration commands).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import neo4j
from neo4j import Driver, ManagedTransaction
from neo4j.exceptions import ClientError, CypherSyntaxError, DatabaseError

from service.core.slot import PlacedSlice, Slot, SlotQuery
from service.domain.cluster import ClusterSpec, Link
from service.domain.error import InvalidInputError, NotFoundError, ReadOnlyViolationError
from service.domain.opgraph import OperatorGraph
from service.graph import guard
from service.graph.catalog import Query, QueryCatalog

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


@dataclass(frozen=True)
class ImportStats:
    model_uid: str
    phase: str
    operators: int
    tensors: int
    edges: int  # PRECEDES + READS + WRITES + HAS_OPERATOR
    seconds: float

    @property
    def items_per_s(self) -> float:
        return (self.operators + self.edges) / self.seconds if self.seconds > 0 else float("inf")


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


class GraphRepository:
    REQUIRED = (
        "constraints", "indexes", "upsert_tenant", "upsert_model", "delete_model_phase",
        "create_model_phase", "place_weights", "upsert_hosts", "upsert_devices", "replace_links", "delete_stale_devices",
        "delete_tenant", "model_summary", "list_devices", "count_labels",
        "place_slices", "mark_slices_done", "delete_done_slices", "refresh_device_state", "replace_host_links",
        "find_candidate_slots", "create_experiment",
        "create_request", "update_requests", "create_slices", "end_slices", "set_weight_residence",
        "live_tenants", "live_models", "live_requests", "delete_old_live_slices",
        "complete_leases", "finish_requests", "close_open_slices", "reconciliation_violations", "request_results",
        "upsert_executor_pool", "set_executor_pool_key", "set_tenant_key", "live_executor_pools",
    )

    def __init__(self, driver: Driver, catalog: QueryCatalog | None = None, *, database: str = "neo4j") -> None:
        self.driver = driver
        self.catalog = catalog or QueryCatalog.load()
        self.catalog.require(self.REQUIRED)
        self.database = database

    # ---- plumbing ----------------------------------------------------------------------------
    def _q(self, name: str, params: Mapping[str, Any]) -> tuple[Query, dict[str, Any]]:
        q = self.catalog.get(name)
        q.check_params(params)
        return q, dict(params)

    def _tx_run(self, tx: ManagedTransaction, name: str, **params: Any) -> list[dict[str, Any]]:
        q, p = self._q(name, params)
        return [r.data() for r in tx.run(q.text, p)]

    def _write(self, name: str, **params: Any) -> list[dict[str, Any]]:
        with self.driver.session(database=self.database) as s:
            return s.execute_write(lambda tx: self._tx_run(tx, name, **params))

    def _read(self, name: str, **params: Any) -> list[dict[str, Any]]:
        with self.driver.session(database=self.database, default_access_mode=neo4j.READ_ACCESS) as s:
            return s.execute_read(lambda tx: self._tx_run(tx, name, **params))

    # ---- schema ---------------------------------------------------------------------------------
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

    # ---- tenants and models -------------------------------------------------------------------
    def upsert_tenant(self, tenant_id: str, **props: Any) -> None:
        self._write("upsert_tenant", tenant_id=check_id("tenant", tenant_id), props=props)

    def upsert_model(self, tenant_id: str, model_id: str, **props: Any) -> None:
        """Set properties of an existing model (e.g. the live service's family and seed)."""
        if not self._write("upsert_model", tenant_id=tenant_id, uid=model_uid(tenant_id, model_id),
                           props={"model_id": model_id, **props}):
            raise InvalidInputError(f"no tenant {tenant_id!r}: create it first", culprit=tenant_id)

    def import_model(self, tenant_id: str, model_id: str, graph: OperatorGraph, *,
                     device_id: str | None = None, create_tenant: bool = True) -> ImportStats:
        """Write one phase of a model's operator graph, replacing an earlier import of that phase.

        Validates first; everything is one transaction, so a failure writes nothing. With
        ``device_id`` the model's weights are made resident on that device.
        """
        graph.validate()
        uid = model_uid(tenant_id, model_id)
        phase = graph.phase
        ordered_tensors = sorted(graph.tensors.values(), key=lambda t: t.kind != "weight")
        position = {t.tensor_id: i for i, t in enumerate(ordered_tensors)}
        op_position = {op.op_id: i for i, op in enumerate(graph.operators)}
        tensor_rows = [
            {"uid": f"{uid}/{t.tensor_id}" if t.kind == "weight" else f"{uid}/{phase}/{t.tensor_id}",
             "tenant_id": tenant_id, "model_uid": uid, "phase": None if t.kind == "weight" else phase,
             "tensor_id": t.tensor_id, "kind": t.kind, "shape": list(t.shape), "dtype": t.dtype,
             "size_bytes": t.size_bytes}
            for t in ordered_tensors
        ]
        num_weights = sum(1 for t in ordered_tensors if t.kind == "weight")
        operators = [
            {"uid": f"{uid}/{phase}/{op.op_id}", "tenant_id": tenant_id, "model_uid": uid, "phase": phase,
             "op_id": op.op_id, "index": i, "kind": op.kind, "target": op.target, "layer": op.layer,
             "flops": op.flops, "bytes_read": op.bytes_read, "bytes_written": op.bytes_written,
             "workspace_bytes": op.workspace_bytes}
            for i, op in enumerate(graph.operators)
        ]
        precedes = [[op_position[a], op_position[b]] for a, b in graph.edges()]
        reads = [[i, position[t]] for i, op in enumerate(graph.operators) for t in op.inputs]
        writes = [[i, position[t]] for i, op in enumerate(graph.operators) for t in op.outputs]
        cfg = graph.config
        model_props = {
            "model_id": model_id, "name": graph.model_name, "style": cfg.get("style"),
            "dtype": cfg.get("dtype"), "num_layers": cfg.get("n_layers"), "d_model": cfg.get("d_model"),
            "weight_bytes": graph.bytes_of("weight"),
        }

        def work(tx: ManagedTransaction) -> None:
            if create_tenant:
                self._tx_run(tx, "upsert_tenant", tenant_id=tenant_id, props={})
            if not self._tx_run(tx, "upsert_model", tenant_id=tenant_id, uid=uid, props=model_props):
                raise InvalidInputError(f"no tenant {tenant_id!r}: create it first", culprit=tenant_id)
            self._tx_run(tx, "delete_model_phase", model_uid=uid, phase=phase)
            done = self._tx_run(
                tx, "create_model_phase", model_uid=uid, weights=tensor_rows[:num_weights],
                tensors=tensor_rows[num_weights:], operators=operators, precedes=precedes, reads=reads,
                writes=writes,
            )
            if not done or not done[0]["ordered"]:
                raise RuntimeError("create_model_phase: collected lists lost their order; nothing was written")
            if device_id is not None:
                placed = self._tx_run(tx, "place_weights", model_uid=uid, device_id=device_id)
                if not placed or placed[0]["placed"] == 0:
                    raise InvalidInputError(f"unknown device {device_id!r}: apply a cluster spec that has it",
                                            culprit=device_id)

        check_id("tenant", tenant_id)
        started = time.perf_counter()
        with self.driver.session(database=self.database) as s:
            s.execute_write(work)
        elapsed = time.perf_counter() - started
        return ImportStats(uid, graph.phase, len(operators), len(tensor_rows),
                           len(precedes) + len(reads) + len(writes) + len(operators), elapsed)

    def place_weights(self, tenant_id: str, model_id: str, device_id: str) -> int:
        rows = self._write("place_weights", model_uid=model_uid(tenant_id, model_id), device_id=device_id)
        placed = int(rows[0]["placed"]) if rows else 0
        if placed == 0:
            raise InvalidInputError(f"nothing placed: unknown model {tenant_id}/{model_id} or device {device_id!r}")
        return placed

    def model_summary(self, tenant_id: str, model_id: str, phase: str) -> dict[str, Any]:
        rows = self._read("model_summary", model_uid=model_uid(tenant_id, model_id), phase=phase)
        return rows[0] if rows else {}

    def delete_tenant(self, tenant_id: str, *, chunk: int = 10_000) -> int:
        """Delete all of a tenant's nodes in bounded chunks; returns how many were deleted."""
        total = 0
        while True:
            rows = self._write("delete_tenant", tenant_id=check_id("tenant", tenant_id), limit=chunk)
            deleted = int(rows[0]["deleted"]) if rows else 0
            total += deleted
            if deleted == 0:
                return total

    # ---- cluster ------------------------------------------------------------------------------
    def apply_cluster(self, spec: ClusterSpec) -> dict[str, int]:
        """Register hosts, devices and links of ``spec`` in one transaction (declarative)."""
        hosts = [{"host_id": h} for h in spec.hosts]
        devices = [
            {"device_id": d.device_id, "host_id": d.host_id, "kind": d.kind, "mem_bytes": d.mem_bytes,
             "peak_flops": d.peak_flops, "mem_bw_bytes_per_s": d.mem_bw_bytes_per_s}
            for d in spec.devices
        ]
        links = [{"src": x.src, "dst": x.dst, "kind": x.kind, "gbps": x.gbps, "latency_us": x.latency_us}
                 for x in spec.links]

        def work(tx: ManagedTransaction) -> None:
            self._tx_run(tx, "upsert_hosts", cluster=spec.name, rows=hosts)
            self._tx_run(tx, "upsert_devices", cluster=spec.name, rows=devices)
            self._tx_run(tx, "delete_stale_devices", cluster=spec.name,
                         device_ids=[d["device_id"] for d in devices], host_ids=spec.hosts)
            self._tx_run(tx, "replace_links", cluster=spec.name, rows=links)

        with self.driver.session(database=self.database) as s:
            s.execute_write(work)
        return {"hosts": len(hosts), "devices": len(devices), "links": len(links)}

    def list_devices(self) -> list[dict[str, Any]]:
        return self._read("list_devices")

    def count_labels(self) -> dict[str, int]:
        return {r["label"]: int(r["nodes"]) for r in self._read("count_labels")}

    def replace_host_links(self, cluster: str, links: Iterable[Link]) -> int:
        """Replace a cluster's host-to-host network links (``Link.src``/``dst`` are host ids)."""
        rows = [{"src": x.src, "dst": x.dst, "kind": x.kind, "gbps": x.gbps, "latency_us": x.latency_us}
                for x in links]
        out = self._write("replace_host_links", cluster=cluster, rows=rows)
        created = int(out[0]["links"]) if out else 0
        if created != len(rows):
            raise InvalidInputError(f"replace_host_links: {len(rows) - created} links name unknown hosts")
        return created

    def refresh_device_state(self, cluster: str) -> int:
        """Recompute what devices cache for the slot search (resident weight bytes, busy windows).

        Needed after weights move (``place_weights``, ``import_model`` with a device) and after
        ``delete_tenant``; the slice writes keep the busy windows themselves. Returns how many devices.
        """
        out = self._write("refresh_device_state", cluster=cluster)
        return int(out[0]["devices"]) if out else 0

    # ---- runtime state: slices ----------------------------------------------------------------
    def place_slices(self, slices: Iterable[PlacedSlice], *, batch: int = 5_000) -> int:
        """Write slices as placed (``UNWIND`` batches, one transaction each); returns how many.

        A batch naming an unknown device writes nothing and raises. Producers named in
        ``depends_on`` must be written in the same or an earlier batch.
        """
        rows = [{"uid": s.uid, "tenant_id": check_id("tenant", s.tenant_id), "model_uid": s.model_uid,
                 "device_id": s.device_id, "start_s": float(s.start_s), "end_s": float(s.end_s),
                 "resident_bytes": int(s.resident_bytes), "depends_on": list(s.depends_on)}
                for s in slices]
        for s in slices:
            if not s.end_s > s.start_s:
                raise InvalidInputError(f"slice {s.uid!r}: end_s must be after start_s", culprit=s.uid)
        placed = 0
        for lo in range(0, len(rows), batch):
            chunk = rows[lo:lo + batch]

            def work(tx: ManagedTransaction, chunk: list[dict[str, Any]] = chunk) -> int:
                out = self._tx_run(tx, "place_slices", rows=chunk)
                n = int(out[0]["placed"]) if out else 0
                if n != len(chunk):
                    raise InvalidInputError(f"place_slices: {len(chunk) - n} slices name unknown devices")
                return n

            with self.driver.session(database=self.database) as session:
                placed += session.execute_write(work)
        return placed

    def mark_slices_done(self, end_s_by_uid: Mapping[str, float | None]) -> int:
        """Mark slices done, with their measured end (``None`` keeps the planned one); returns how many."""
        rows = [{"uid": uid, "end_s": end} for uid, end in end_s_by_uid.items()]
        out = self._write("mark_slices_done", rows=rows)
        return int(out[0]["done"]) if out else 0

    def delete_done_slices(self, before_s: float, *, chunk: int = 10_000) -> int:
        """Delete done slices that ended before ``before_s``, in bounded chunks; returns how many."""
        total = 0
        while True:
            out = self._write("delete_done_slices", before_s=float(before_s), limit=chunk)
            deleted = int(out[0]["deleted"]) if out else 0
            total += deleted
            if deleted == 0:
                return total

    def find_candidate_slots(self, query: SlotQuery, *, scan_first: int | None = None) -> list[Slot]:
        """The best ``query.k`` slots by the contract of :mod:`service.core.slot`, answered by Cypher.

        ``scan_first``: devices whose free start is computed in the query's first tier (default
        ``max(128, 16 * k)``); a speed knob only: any value >= 1 gives the same answer."""
        first = max(128, 16 * query.k) if scan_first is None else scan_first
        if first < 1:
            raise InvalidInputError(f"scan_first must be >= 1, got {first}")
        rows = self._read(
            "find_candidate_slots", cluster=query.cluster, now_s=float(query.now_s),
            duration_s_by_kind={k: float(v) for k, v in query.duration_s_by_kind.items()},
            slice_bytes=int(query.slice_bytes), weight_bytes=int(query.weight_bytes),
            needs_weights=bool(query.needs_weights), model_uid=query.model_uid,
            input_deps=[{"device_id": d.device_id, "end_s": float(d.end_s), "bytes": int(d.bytes)}
                        for d in query.input_deps],
            margin=float(query.margin), k=int(query.k), scan_first=int(first),
        )
        return [Slot(r["device_id"], float(r["start_s"]), float(r["headroom_bytes"])) for r in rows]

    # ---- inspection ---------------------------------------------------------------------------
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
        q.check_params(params or {})
        return self.run_read(q.text, params)

    def inspection_names(self) -> list[str]:
        return sorted(q.name for q in self.catalog.by_category("inspect"))

    def inspection_queries(self) -> Iterable[Query]:
        return sorted(self.catalog.by_category("inspect"), key=lambda q: q.name)

    # ---- experiment records ----------------------------------------------------------------------
    def create_experiment(self, uid: str, *, kind: str, config: Mapping[str, Any], results: Any) -> str:
        """Persist a run (replay, benchmark) with its config and results as JSON properties."""
        rows = self._write("create_experiment", uid=uid, kind=kind,
                           config_json=json.dumps(config, default=float),
                           results_json=json.dumps(results, default=float))
        return str(rows[0]["uid"])

    # ---- the live service -------------------------------------------------------------------------
    def create_requests(self, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Persist accepted requests (with their prompts) in one transaction; all or nothing.
        A row with an idempotency key its tenant used before creates nothing; the answer maps
        each such key to the earlier request (uid, body_sha, status, token_budget, prompt_tokens)."""
        def work(tx: ManagedTransaction) -> dict[str, dict[str, Any]]:
            out = self._tx_run(tx, "create_request", rows=rows)
            matched = int(out[0]["matched"]) if out else 0
            if matched != len(rows):
                raise InvalidInputError(f"{len(rows) - matched} of {len(rows)} requests name an unknown model")
            return {str(e["idempotency_key"]): e for e in out[0]["existing"]} if out else {}

        with self.driver.session(database=self.database) as s:
            return s.execute_write(work)

    def complete_leases(self, rows: list[dict[str, Any]]) -> set[str]:
        """Results of completed leases, each with its request's final state and its done Slice, in
        one transaction; returns the uids of the requests completed (a finished one is left out)."""
        if not rows:
            return set()
        rows = sorted(rows, key=lambda r: str(r["slice"]["uid"]))  # one lock order with create_slices
        out = self._write("complete_leases", rows=rows)
        return set(out[0]["completed"]) if out else set()

    def request_results(self, uids: list[str]) -> dict[str, dict[str, Any]]:
        """Status and result of requests as Neo4j holds them, by uid (absent: unknown)."""
        return {str(r["uid"]): r for r in self._read("request_results", uids=list(uids))}

    def finish_requests(self, rows: list[dict[str, Any]]) -> set[str]:
        """Requests ending without a result (cancelled, failed), with their lease's end, in one
        transaction; returns the uids finished now (one finished before is left out)."""
        if not rows:
            return set()
        out = self._write("finish_requests", rows=rows)
        return set(out[0]["finished"]) if out else set()

    def close_open_slices(self, end_wall: float) -> int:
        """Restart reconciliation: close the live Slices a previous process left open."""
        out = self._write("close_open_slices", end_wall=float(end_wall))
        return int(out[0]["closed"]) if out else 0

    def update_requests(self, rows: list[dict[str, Any]]) -> int:
        """Batched request updates; rows of requests already finished change nothing."""
        out = self._write("update_requests", rows=rows)
        return int(out[0]["updated"]) if out else 0

    def create_slices(self, rows: list[dict[str, Any]]) -> int:
        rows = sorted(rows, key=lambda r: str(r["uid"]))  # one lock order with complete_leases: no deadlock
        out = self._write("create_slices", rows=rows)
        return int(out[0]["created"]) if out else 0

    def end_slices(self, rows: list[dict[str, Any]]) -> int:
        out = self._write("end_slices", rows=rows)
        return int(out[0]["ended"]) if out else 0

    def set_weight_residence(self, model_uid: str, device_ids: list[str], *, cluster: str) -> None:
        """Weights of ``model_uid`` resident on exactly ``device_ids``; refreshes the cluster's cached device state."""
        def work(tx: ManagedTransaction) -> None:
            self._tx_run(tx, "set_weight_residence", model_uid=model_uid, device_ids=device_ids)
            self._tx_run(tx, "refresh_device_state", cluster=cluster)

        with self.driver.session(database=self.database) as s:
            s.execute_write(work)

    def live_tenants(self) -> list[dict[str, Any]]:
        return self._read("live_tenants")

    def live_executor_pools(self) -> list[dict[str, Any]]:
        return self._read("live_executor_pools")

    # ---- keys (hashes only) ---------------------------------------------------------------------
    def upsert_executor_pool(self, pool_id: str, **props: Any) -> None:
        self._write("upsert_executor_pool", pool_id=check_id("pool", pool_id), props=props)

    def set_tenant_key(self, tenant_id: str, key_hash: str | None) -> None:
        """A tenant's new key hash, or ``None``: revoked. :class:`NotFoundError` for no tenant."""
        if not self._write("set_tenant_key", tenant_id=tenant_id, key_hash=key_hash):
            raise NotFoundError(f"no tenant {tenant_id!r}")

    def set_executor_pool_key(self, pool_id: str, key_hash: str | None) -> None:
        if not self._write("set_executor_pool_key", pool_id=pool_id, key_hash=key_hash):
            raise NotFoundError(f"no executor pool {pool_id!r}")

    def live_models(self) -> list[dict[str, Any]]:
        return self._read("live_models")

    def live_requests(self, since: float) -> list[dict[str, Any]]:
        return [r["request"] for r in self._read("live_requests", since=float(since))]

    def delete_old_live_slices(self, before_wall: float, *, chunk: int = 10_000) -> int:
        """Delete live Slices that ended before ``before_wall`` (epoch s), in bounded chunks."""
        total = 0
        while True:
            out = self._write("delete_old_live_slices", before_wall=float(before_wall), limit=chunk)
            deleted = int(out[0]["deleted"]) if out else 0
            total += deleted
            if deleted < chunk:
                return total
