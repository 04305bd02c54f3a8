"""Candidate slots for a slice: one contract, answered in memory here and in Cypher by the GMG.

Pure (no I/O). A *slot* is ``(device, start_s)`` where a slice may run. For every device of the
cluster whose kind has a duration in :attr:`SlotQuery.duration_s_by_kind`, the slot is the
earliest ``start_s`` that is

* **not before** ``max(now_s, ready_s)``, where ``ready_s`` is the latest producer finish plus
  transfer time (dependency-safe): for an input of ``bytes`` from a producer on device ``p``,
  ``ready = end_s + transfer(p, d, bytes)``; the transfer is 0 on the same device, else
  ``bytes / (gbps * 1e9 / 8) + latency_us * 1e-6`` over the *effective link* ``p -> d``:
  the device link ``p -> d`` if there is one, else the host link ``host(p) -> host(d)`` when the
  hosts differ (the per-host network model that keeps a large cluster's edges few). No
  effective link: the device is not a candidate;
* **free**: no live placement ``[s, e)`` on the device overlaps ``[start_s, start_s + duration)``
  (``s < start_s + duration and start_s < e``); a device runs one slice at a time;
* **memory-safe**: at every instant of the window, the device's resident weights plus the
  resident bytes of live placements overlapping that instant, plus ``slice_bytes``, plus
  ``weight_bytes`` when ``needs_weights`` and the model has no weights on the device, stay
  ``<= mem_bytes * (1 - margin)``. Because a free window overlaps no placement, the placement
  term is zero there and the test does not depend on ``start_s``: ``headroom_bytes`` is
  ``mem_bytes * (1 - margin) - (resident + slice_bytes + missing weights)`` and must be ``>= 0``.

The earliest free start is ``max(now_s, ready_s)`` or the end of one of the device's placements,
so both implementations only try those. Candidates rank by ``(start_s, -headroom_bytes,
device_id)``; the best ``k`` are returned. Times are seconds, sizes bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class InputDep:
    """An input of the slice: produced on ``device_id``, ready there at ``end_s``, ``bytes`` to move."""

    device_id: str
    end_s: float
    bytes: int


@dataclass(frozen=True, slots=True)
class SlotQuery:
    """Where and when may a slice of ``model_uid`` run?

    ``cluster``: the devices searched (a :class:`ClusterState` is one cluster's view).
    ``duration_s_by_kind``: the slice's run time per device kind; kinds absent are not candidates.
    ``slice_bytes``: memory the slice holds while it runs (activations, workspace).
    ``weight_bytes``: the model's weights, added where ``needs_weights`` and they are not resident.
    ``margin``: fraction of each device's memory kept free. ``k``: how many slots to return.
    """

    cluster: str
    tenant_id: str
    model_uid: str
    now_s: float
    duration_s_by_kind: Mapping[str, float]
    slice_bytes: int
    weight_bytes: int = 0
    needs_weights: bool = False
    input_deps: Sequence[InputDep] = ()
    margin: float = 0.05
    k: int = 8

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if self.slice_bytes < 0 or self.weight_bytes < 0:
            raise ValueError("slice_bytes and weight_bytes must be >= 0")
        bad = {kind: d for kind, d in self.duration_s_by_kind.items() if not d > 0}
        if bad:
            raise ValueError(f"durations must be > 0 s, got {bad}")
        if any(dep.bytes < 0 for dep in self.input_deps):
            raise ValueError("input bytes must be >= 0")


@dataclass(frozen=True, slots=True)
class Slot:
    """A feasible start: ``headroom_bytes`` is what the device keeps free below its limit meanwhile."""

    device_id: str
    start_s: float
    headroom_bytes: float


@dataclass(frozen=True, slots=True)
class PlacedSlice:
    """A slice committed to ``device_id`` for ``[start_s, end_s)`` (a planned ``Slice`` node of
    the GMG, ``ON`` its device).

    ``resident_bytes``: memory it holds in its window; ``depends_on``: uids of producer slices
    (``DEPENDS_ON``: their outputs are its inputs). Optional, for a slice cut from a model's
    operator graph: ``op_ids``, the operators it runs (``op_id`` of the model's ``phase``;
    ``COVERS`` edges), and ``after``, the uid of the slice it follows in its iteration (``AFTER``).
    Empty ``op_ids`` and ``None`` ``after`` leave those edges as they were.
    """

    uid: str
    tenant_id: str
    model_uid: str
    device_id: str
    start_s: float
    end_s: float
    resident_bytes: int
    depends_on: tuple[str, ...] = ()
    phase: str | None = None
    op_ids: tuple[str, ...] = ()
    after: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceView:
    device_id: str
    host_id: str
    kind: str
    mem_bytes: int


@dataclass(frozen=True, slots=True)
class LinkView:
    gbps: float
    latency_us: float

    def transfer_s(self, num_bytes: int) -> float:
        return num_bytes / (self.gbps * 1e9 / 8) + self.latency_us * 1e-6


@dataclass(frozen=True, slots=True)
class Placement:
    """A live (placed or running) slice on a device during ``[start_s, end_s)``."""

    start_s: float
    end_s: float
    resident_bytes: int


@dataclass(slots=True)
class ClusterState:
    """An in-memory view of one cluster's devices, links and live runtime state.

    ``links``: directed device links ``(src, dst)``; ``host_links``: directed host links.
    ``placements``: live placements per device, sorted by ``start_s``.
    ``resident``: weight bytes per device per ``model_uid`` resident there.
    """

    cluster: str
    devices: Mapping[str, DeviceView]
    links: Mapping[tuple[str, str], LinkView] = field(default_factory=dict)
    host_links: Mapping[tuple[str, str], LinkView] = field(default_factory=dict)
    placements: Mapping[str, Sequence[Placement]] = field(default_factory=dict)
    resident: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def link(self, src: str, dst: str) -> LinkView | None:
        """The effective link: the device link, else the host link between different hosts."""
        direct = self.links.get((src, dst))
        if direct is not None:
            return direct
        a, b = self.devices.get(src), self.devices.get(dst)
        if a is None or b is None or a.host_id == b.host_id:
            return None
        return self.host_links.get((a.host_id, b.host_id))

    def resident_bytes(self, device_id: str) -> int:
        return sum(self.resident.get(device_id, {}).values())


def ready_s(state: ClusterState, device_id: str, deps: Sequence[InputDep]) -> float | None:
    """When every input can be on ``device_id`` (``-inf`` without inputs); ``None``: unreachable."""
    ready = float("-inf")
    for dep in deps:
        if dep.device_id == device_id:
            arrive = dep.end_s
        else:
            link = state.link(dep.device_id, device_id)
            if link is None:
                return None
            arrive = dep.end_s + link.transfer_s(dep.bytes)
        ready = max(ready, arrive)
    return ready


def earliest_free_start(placements: Sequence[Placement], not_before_s: float, duration_s: float) -> float:
    """The earliest ``t >= not_before_s`` with ``[t, t + duration_s)`` overlapping no placement.

    Tries ``not_before_s`` and each placement end after it, in order, and checks each against
    every placement that could overlap (those starting before ``t + duration_s``).
    """
    starts = [p.start_s for p in placements]
    candidates = sorted({not_before_s, *(p.end_s for p in placements if p.end_s > not_before_s)})
    for t in candidates:
        upto = bisect.bisect_left(starts, t + duration_s)  # placements with start < t + duration
        if not any(t < p.end_s for p in placements[:upto]):
            return t
    raise AssertionError("unreachable: the last placement end is always free")


def window_peak_bytes(placements: Sequence[Placement], start_s: float, end_s: float) -> int:
    """The most bytes that live placements hold at one instant of ``[start_s, end_s)``."""
    inside = [p for p in placements if p.start_s < end_s and start_s < p.end_s]
    instants = [start_s, *(p.start_s for p in inside if p.start_s > start_s)]
    return max((sum(p.resident_bytes for p in inside if p.start_s <= t < p.end_s) for t in instants), default=0)


def find_slots_in_memory(state: ClusterState, query: SlotQuery) -> list[Slot]:
    """The best ``query.k`` candidate slots of ``state`` (see the module docstring)."""
    if query.cluster != state.cluster:
        raise ValueError(f"query for cluster {query.cluster!r} against a view of {state.cluster!r}")
    slots: list[Slot] = []
    for device in state.devices.values():
        duration = query.duration_s_by_kind.get(device.kind)
        if duration is None:
            continue
        ready = ready_s(state, device.device_id, query.input_deps)
        if ready is None:
            continue
        placements = state.placements.get(device.device_id, ())
        start = earliest_free_start(placements, max(query.now_s, ready), duration)
        missing = 0
        if query.needs_weights and query.model_uid not in state.resident.get(device.device_id, {}):
            missing = query.weight_bytes
        committed = state.resident_bytes(device.device_id) + window_peak_bytes(placements, start, start + duration)
        headroom = device.mem_bytes * (1.0 - query.margin) - (committed + query.slice_bytes + missing)
        if headroom >= 0:
            slots.append(Slot(device.device_id, start, headroom))
    slots.sort(key=lambda s: (s.start_s, -s.headroom_bytes, s.device_id))
    return slots[: query.k]
