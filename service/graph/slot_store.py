"""The candidate-slot search in Cypher (the contract of :mod:`service.core.slot`) and the writes
of its inputs that a planner makes: planned slices (``ON`` their device, ``COVERS`` the operators
they run, ``AFTER`` their predecessor; the busy windows devices cache) and host-to-host links.
The live service's leases are running Slices too, in epoch seconds (:mod:`service.graph.live_store`,
:mod:`service.domain.slice_state`); the slot-search tests and benchmark set scenarios up with these."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from neo4j import ManagedTransaction

from service.core.slot import PlacedSlice, Slot, SlotQuery
from service.domain.cluster import Link
from service.domain.error import InvalidInputError
from service.graph.store import StorePart, check_id


class SlotStore(StorePart):
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
        """Write slices as planned (``UNWIND`` batches, one transaction each, the busy windows of
        the devices touched refreshed in it); returns how many.

        A batch naming an unknown device, operator or predecessor writes nothing and raises.
        Producers named in ``depends_on`` and predecessors named in ``after`` must be written in
        the same or an earlier batch; operators (``op_ids`` of ``phase``) must be in the GMG.
        """
        slices = list(slices)
        for s in slices:
            if not s.end_s > s.start_s:
                raise InvalidInputError(f"slice {s.uid!r}: end_s must be after start_s", culprit=s.uid)
            if s.op_ids and not s.phase:
                raise InvalidInputError(f"slice {s.uid!r}: op_ids need the phase they belong to", culprit=s.uid)
            if s.after == s.uid:
                raise InvalidInputError(f"slice {s.uid!r} cannot follow itself", culprit=s.uid)
        placed = 0
        for lo in range(0, len(slices), batch):
            chunk = slices[lo:lo + batch]
            rows = [{"uid": s.uid, "tenant_id": check_id("tenant", s.tenant_id), "model_uid": s.model_uid,
                     "device_id": s.device_id, "start_s": float(s.start_s), "end_s": float(s.end_s),
                     "resident_bytes": int(s.resident_bytes), "depends_on": list(s.depends_on)} for s in chunk]
            # Operator uids as the GMG names them (service.graph.model_store): model/phase/op_id.
            covers = [{"uid": s.uid, "phase": s.phase,
                       "op_uids": [f"{s.model_uid}/{s.phase}/{op}" for op in dict.fromkeys(s.op_ids)]}
                      for s in chunk if s.op_ids]
            after = [{"uid": s.uid, "after": s.after} for s in chunk if s.after is not None]

            def work(tx: ManagedTransaction, rows: list[dict[str, Any]] = rows, covers: list[dict[str, Any]] = covers,
                     after: list[dict[str, Any]] = after) -> int:
                out = self._tx_run(tx, "place_slices", rows=rows, covers=covers, after=after)[0]
                if int(out["placed"]) != len(rows):
                    raise InvalidInputError(f"place_slices: {len(rows) - int(out['placed'])} slices name unknown devices")
                missing = sum(len(c["op_uids"]) for c in covers) - int(out["covered"])
                if missing:
                    raise InvalidInputError(f"place_slices: {missing} operators named by op_ids are not in the GMG "
                                            "(op_id of the slice's model and phase)")
                if int(out["afters"]) != len(after):
                    raise InvalidInputError(f"place_slices: {len(after) - int(out['afters'])} predecessors named by "
                                            "after are unknown slices (write them in the same or an earlier batch)")
                self._tx_refresh_busy_windows(tx, out["touched"])
                return len(rows)

            placed += self._execute_write(work)
        return placed

    def mark_slices_done(self, end_s_by_uid: Mapping[str, float | None]) -> int:
        """Mark slices done, with their measured end (``None`` keeps the planned one); returns how
        many. Their devices' busy windows are refreshed in the same transaction."""
        rows = [{"uid": uid, "end_s": end} for uid, end in end_s_by_uid.items()]
        out = self._write_slices("mark_slices_done", rows=rows)
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
