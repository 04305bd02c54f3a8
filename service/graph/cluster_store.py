"""The cluster in the GMG: hosts, devices and links applied declaratively, where each model's
weights reside, and the device state the slot search reads."""

from __future__ import annotations

from typing import Any

from neo4j import ManagedTransaction

from service.domain.cluster import ClusterSpec
from service.graph.store import StorePart


class ClusterStore(StorePart):
    QUERIES: tuple[str, ...] = ("upsert_hosts", "upsert_devices", "replace_links", "delete_stale_devices", "list_devices",
               "count_labels", "refresh_device_state", "set_weight_residence")

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

        self._execute_write(work)
        return {"hosts": len(hosts), "devices": len(devices), "links": len(links)}

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
        def work(tx: ManagedTransaction) -> None:
            self._tx_run(tx, "set_weight_residence", model_uid=model_uid, device_ids=device_ids)
            self._tx_run(tx, "refresh_device_state", cluster=cluster)

        self._execute_write(work)
