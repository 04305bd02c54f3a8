"""The candidate-slot search in Cypher (the contract of :mod:`service.core.slot`) and the writes
of its inputs that only a planner makes: planned slices (the busy windows devices cache) and
host-to-host links. The live service writes neither (its leases are Slices with wall times, see
:mod:`service.graph.live_store`); the slot-search tests and benchmark set scenarios up with them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from neo4j import ManagedTransaction

from service.core.slot import PlacedSlice, Slot, SlotQuery
from service.domain.cluster import Link
from service.domain.error import InvalidInputError
from service.graph.store import GraphStore, check_id


class SlotStore(GraphStore):
    QUERIES: tuple[str, ...] = ("find_candidate_slots", "place_slices", "mark_slices_done", "delete_done_slices",
               "replace_host_links")

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

    def replace_host_links(self, cluster: str, links: Iterable[Link]) -> int:
        """Replace a cluster's host-to-host network links (``Link.src``/``dst`` are host ids)."""
        rows = [{"src": x.src, "dst": x.dst, "kind": x.kind, "gbps": x.gbps, "latency_us": x.latency_us}
                for x in links]
        out = self._write("replace_host_links", cluster=cluster, rows=rows)
        created = int(out[0]["links"]) if out else 0
        if created != len(rows):
            raise InvalidInputError(f"replace_host_links: {len(rows) - created} links name unknown hosts")
        return created
