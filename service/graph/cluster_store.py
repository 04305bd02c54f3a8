"""The cluster in the GMG: hosts, devices and links applied declaratively, where each model's
weights reside, and the device state the slot search reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neo4j import ManagedTransaction

from service.domain.cluster import ClusterSpec
from service.graph.store import GraphStore, StorePart

LINK_CHUNK = 20_000  # link rows per statement of a cluster write


class ClusterStore(StorePart):
    QUERIES: tuple[str, ...] = ("upsert_hosts", "upsert_devices", "delete_stale_devices", "cluster_links",
               "count_cluster_links", "set_links", "delete_links", "list_devices", "count_labels",
               "refresh_device_state", "set_weight_residence")

    def __init__(self, store: GraphStore) -> None:
        super().__init__(store)
        # per cluster, the links this store last committed: {(src, dst): (kind, gbps, latency_us)}
        self._links: dict[str, dict[tuple[str, str], tuple[Any, ...]]] = {}

    def apply_cluster(self, spec: ClusterSpec) -> dict[str, int]:
        """Register hosts, devices and links of ``spec`` in one transaction (declarative).

        Links are written as a difference: only those added, changed or gone. A live cluster
        re-applies its whole spec whenever an executor joins, and a full mesh has devices^2
        links (160,000 at 400 devices): rewriting them all held that many locks for seconds and
        stalled every lease write (docs/scaling.md). What is in the database is compared with
        what this store last committed by a count of the cluster's links (a degree lookup per
        device); when they disagree, or the store has not written this cluster yet, the links
        are read back once and diffed against them.
        """
        hosts = [{"host_id": h} for h in spec.hosts]
        devices = [
            {"device_id": d.device_id, "host_id": d.host_id, "kind": d.kind, "mem_bytes": d.mem_bytes,
             "peak_flops": d.peak_flops, "mem_bw_bytes_per_s": d.mem_bw_bytes_per_s}
            for d in spec.devices
        ]
        wanted = {(x.src, x.dst): (x.kind, x.gbps, x.latency_us) for x in spec.links}
        kept = {d["device_id"] for d in devices}

        def work(tx: ManagedTransaction) -> dict[str, int]:
            self._tx_run(tx, "upsert_hosts", cluster=spec.name, rows=hosts)
            self._tx_run(tx, "upsert_devices", cluster=spec.name, rows=devices)
            self._tx_run(tx, "delete_stale_devices", cluster=spec.name, device_ids=sorted(kept), host_ids=spec.hosts)
            # a removed device took its links with it
            have = {k: v for k, v in self._links.get(spec.name, {}).items() if k[0] in kept and k[1] in kept}
            count = self._tx_run(tx, "count_cluster_links", cluster=spec.name)
            if spec.name not in self._links or int(count[0]["links"] or 0) != len(have):
                have = {(r["src"], r["dst"]): (r["kind"], r["gbps"], r["latency_us"])
                        for r in self._tx_run(tx, "cluster_links", cluster=spec.name)}
            gone = [{"src": a, "dst": b} for (a, b) in have.keys() - wanted.keys()]
            changed = [{"src": a, "dst": b, "kind": v[0], "gbps": v[1], "latency_us": v[2]}
                       for (a, b), v in wanted.items() if have.get((a, b)) != v]
            for i in range(0, len(gone), LINK_CHUNK):
                self._tx_run(tx, "delete_links", pairs=gone[i:i + LINK_CHUNK])
            for i in range(0, len(changed), LINK_CHUNK):
                self._tx_run(tx, "set_links", rows=changed[i:i + LINK_CHUNK])
            return {"links_written": len(changed), "links_deleted": len(gone)}

        try:
            written = self._execute_write(work)
        except BaseException:
            self._links.pop(spec.name, None)  # what committed is unknown: read it back next time
            raise
        self._links[spec.name] = wanted
        return {"hosts": len(hosts), "devices": len(devices), "links": len(wanted), **written}

    def list_devices(self) -> list[dict[str, Any]]:
        return self._read("list_devices")

    def count_labels(self) -> dict[str, int]:
        return {r["label"]: int(r["nodes"]) for r in self._read("count_labels")}

    def refresh_device_state(self, cluster: str) -> int:
        """Recompute what devices cache for the slot search (resident weight bytes, busy windows).

        Needed after weights move (``place_weights``, ``import_model`` with a device) and after
        ``delete_tenant``; the slice writes keep the busy windows themselves. Returns how many devices.
        """
        out = self._write("refresh_device_state", cluster=cluster)
        return int(out[0]["devices"]) if out else 0

    def set_weight_residence(self, model_uid: str, device_ids: list[str], *, cluster: str) -> None:
        """Weights of ``model_uid`` resident on exactly ``device_ids``; refreshes the cluster's cached device state."""
        self.set_weight_residences({model_uid: device_ids}, cluster=cluster)

    def set_weight_residences(self, residences: Mapping[str, Sequence[str]], *, cluster: str) -> None:
        """Each model's weights resident on exactly its devices, then one refresh of the cluster's
        cached device state, in one transaction (a refresh locks every device of the cluster)."""
        def work(tx: ManagedTransaction) -> None:
            for model_uid, device_ids in sorted(residences.items()):
                self._tx_run(tx, "set_weight_residence", model_uid=model_uid, device_ids=list(device_ids))
            self._tx_run(tx, "refresh_device_state", cluster=cluster)

        if residences:
            self._execute_write(work)
