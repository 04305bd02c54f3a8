"""Cluster topology: hosts, devices and the links between them. Pure data with validation.

A spec document (YAML or JSON, parsed by the caller) looks like::

    name: 2x4xH100
    network: {gbps: 400, latency_us: 5}          # between every pair of hosts' devices
    hosts:
      - host_id: node0
        devices: {kind: H100-80GB, count: 4}      # or a list of {device_id, kind, ...}
        intra_link: {kind: nvlink, gbps: 3600, latency_us: 2}
    links:                                        # optional explicit extra links
      - {src: node0/gpu0, dst: node1/gpu0, gbps: 100, latency_us: 8}

Device numbers default to the kind's catalog entry and may be overridden per device.
Links are undirected in the spec and stored in both directions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.domain.error import InvalidClusterError

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class DeviceKind:
    name: str
    mem_bytes: int
    peak_flops: float  # dense fp16/bf16 FLOP/s
    mem_bw_bytes_per_s: float


# Public datasheet numbers (dense 16-bit tensor throughput, HBM bandwidth). "cpu" is a
# placeholder for a laptop-class CPU socket; the profiler measures the real one.
DEVICE_KINDS: dict[str, DeviceKind] = {
    k.name: k
    for k in (
        DeviceKind("A100-80GB", 80 * GIB, 312e12, 2.039e12),
        DeviceKind("A100-40GB", 40 * GIB, 312e12, 1.555e12),
        DeviceKind("H100-80GB", 80 * GIB, 989e12, 3.35e12),
        DeviceKind("A40", 48 * GIB, 149.7e12, 0.696e12),
        DeviceKind("L4", 24 * GIB, 121e12, 0.300e12),
        DeviceKind("cpu", 8 * GIB, 0.2e12, 0.02e12),
    )
}


@dataclass(frozen=True, slots=True)
class Device:
    device_id: str
    host_id: str
    kind: str
    mem_bytes: int
    peak_flops: float
    mem_bw_bytes_per_s: float


@dataclass(frozen=True, slots=True)
class Link:
    """A directed link; ``kind`` is e.g. nvlink, pcie, network, loopback."""

    src: str
    dst: str
    kind: str
    gbps: float
    latency_us: float

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8


@dataclass(slots=True)
class ClusterSpec:
    name: str
    hosts: list[str]
    devices: list[Device]
    links: list[Link]

    def device(self, device_id: str) -> Device:
        for d in self.devices:
            if d.device_id == device_id:
                return d
        raise InvalidClusterError(f"unknown device {device_id!r}", culprit=device_id)

    def link(self, src: str, dst: str) -> Link | None:
        for link in self.links:
            if link.src == src and link.dst == dst:
                return link
        return None

    @property
    def total_mem_bytes(self) -> int:
        return sum(d.mem_bytes for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        hosts: list[dict[str, Any]] = []
        for h in self.hosts:
            hosts.append({
                "host_id": h,
                "devices": [
                    {"device_id": d.device_id, "kind": d.kind, "mem_bytes": d.mem_bytes,
                     "peak_flops": d.peak_flops, "mem_bw_bytes_per_s": d.mem_bw_bytes_per_s}
                    for d in self.devices if d.host_id == h
                ],
            })
        links = [
            {"src": x.src, "dst": x.dst, "kind": x.kind, "gbps": x.gbps, "latency_us": x.latency_us}
            for x in self.links if x.src < x.dst
        ]
        return {"name": self.name, "hosts": hosts, "links": links}

    @staticmethod
    def from_dict(data: Any) -> ClusterSpec:
        """Parse and validate a spec document; raise :class:`InvalidClusterError` naming the culprit."""
        if not isinstance(data, dict):
            raise InvalidClusterError("a cluster spec must be a mapping with 'name' and 'hosts'")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidClusterError("cluster spec: missing 'name'")
        raw_hosts = data.get("hosts")
        if not isinstance(raw_hosts, list) or not raw_hosts:
            raise InvalidClusterError("cluster spec: 'hosts' must be a non-empty list")

        hosts: list[str] = []
        devices: list[Device] = []
        pairs: dict[tuple[str, str], Link] = {}

        def add_link(src: str, dst: str, raw: dict[str, Any], default_kind: str) -> None:
            if src == dst:
                raise InvalidClusterError(f"link from {src!r} to itself (a cycle of length one)", culprit=src)
            gbps = _positive(raw, "gbps", f"link {src}-{dst}")
            latency = float(raw.get("latency_us", 0.0))
            if latency < 0:
                raise InvalidClusterError(f"link {src}-{dst}: negative latency_us", culprit=f"{src}-{dst}")
            key = (min(src, dst), max(src, dst))
            kind = str(raw.get("kind", default_kind))
            pairs[key] = Link(key[0], key[1], kind, gbps, latency)

        for i, h in enumerate(raw_hosts):
            if not isinstance(h, dict) or not isinstance(h.get("host_id"), str):
                raise InvalidClusterError(f"cluster spec: hosts[{i}] needs a string 'host_id'", culprit=f"hosts[{i}]")
            host_id = h["host_id"]
            if host_id in hosts:
                raise InvalidClusterError(f"duplicate host id {host_id!r}", culprit=host_id)
            hosts.append(host_id)
            host_devices = [_device(host_id, j, d) for j, d in enumerate(_expand(host_id, h.get("devices")))]
            devices.extend(host_devices)
            intra = h.get("intra_link")
            if intra is not None and len(host_devices) > 1:
                if not isinstance(intra, dict):
                    raise InvalidClusterError(f"host {host_id!r}: intra_link must be a mapping", culprit=host_id)
                for a in range(len(host_devices)):
                    for b in range(a + 1, len(host_devices)):
                        add_link(host_devices[a].device_id, host_devices[b].device_id, intra, "nvlink")

        ids = [d.device_id for d in devices]
        dup = next((x for x in ids if ids.count(x) > 1), None)
        if dup is not None:
            raise InvalidClusterError(f"duplicate device id {dup!r}", culprit=dup)

        network = data.get("network")
        if network is not None and len(hosts) > 1:
            if not isinstance(network, dict):
                raise InvalidClusterError("cluster spec: 'network' must be a mapping")
            for left in devices:
                for right in devices:
                    if left.host_id < right.host_id:
                        add_link(left.device_id, right.device_id, network, "network")

        known = set(ids)
        for i, raw in enumerate(data.get("links") or []):
            if not isinstance(raw, dict):
                raise InvalidClusterError(f"links[{i}] must be a mapping", culprit=f"links[{i}]")
            src, dst = str(raw.get("src")), str(raw.get("dst"))
            for end in (src, dst):
                if end not in known:
                    raise InvalidClusterError(f"links[{i}] names unknown device {end!r} (dangling link)", culprit=end)
            add_link(src, dst, raw, "pcie")

        links: list[Link] = []
        for link in pairs.values():
            links.append(link)
            links.append(Link(link.dst, link.src, link.kind, link.gbps, link.latency_us))
        return ClusterSpec(name=name, hosts=hosts, devices=devices, links=links)


def _expand(host_id: str, raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, dict):  # {kind, count, [mem_bytes ...]}
        count = raw.get("count", 1)
        if not isinstance(count, int) or count <= 0:
            raise InvalidClusterError(f"host {host_id!r}: device count must be a positive integer", culprit=host_id)
        prefix = "cpu" if raw.get("kind") == "cpu" else "gpu"
        return [{**{k: v for k, v in raw.items() if k != "count"}, "device_id": f"{host_id}/{prefix}{i}"}
                for i in range(count)]
    if isinstance(raw, list) and raw and all(isinstance(x, dict) for x in raw):
        return raw
    raise InvalidClusterError(f"host {host_id!r}: 'devices' must be {{kind, count}} or a list of devices", culprit=host_id)


def _device(host_id: str, index: int, raw: dict[str, Any]) -> Device:
    device_id = raw.get("device_id")
    if not isinstance(device_id, str) or not device_id:
        raise InvalidClusterError(f"host {host_id!r}: device #{index} needs a 'device_id'", culprit=host_id)
    kind_name = raw.get("kind")
    kind = DEVICE_KINDS.get(str(kind_name))
    if kind is None:
        raise InvalidClusterError(
            f"device {device_id!r}: unknown device kind {kind_name!r} (known: {', '.join(DEVICE_KINDS)})",
            culprit=device_id,
        )
    merged = {"mem_bytes": kind.mem_bytes, "peak_flops": kind.peak_flops,
              "mem_bw_bytes_per_s": kind.mem_bw_bytes_per_s, **raw}
    if "mem_gib" in raw:
        merged["mem_bytes"] = float(raw["mem_gib"]) * GIB
    return Device(
        device_id=device_id, host_id=host_id, kind=kind.name,
        mem_bytes=int(_positive(merged, "mem_bytes", device_id)),
        peak_flops=_positive(merged, "peak_flops", device_id),
        mem_bw_bytes_per_s=_positive(merged, "mem_bw_bytes_per_s", device_id),
    )


def _positive(raw: dict[str, Any], key: str, where: str) -> float:
    value = raw.get(key)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidClusterError(f"{where}: {key} must be a number, got {value!r}", culprit=where) from None
    if not number > 0:
        raise InvalidClusterError(f"{where}: {key} must be positive, got {value!r}", culprit=where)
    return number
