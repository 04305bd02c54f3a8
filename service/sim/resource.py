"""Resources of the simulated cluster, in the manner of SimPy's resources: device timelines
(one piece of work at a time per device, placed-slice reservations) and links (first-come
first-served per directed link). Pure bookkeeping of times; memory is the ledger's.

Links
    A directed link serialises transfers first-come first-served: a transfer starts when the
    link is free, occupies it for ``bytes / bandwidth`` and arrives ``latency`` later
    (propagation overlaps the next transfer's wire time). Chosen over fair sharing because a
    committed transfer's arrival time never changes afterwards, which the what-if needs.

Devices
    A device runs one slice at a time. Placed slices reserve a window; a replica iteration
    starts at the earliest time all its devices are free for its whole duration (it waits
    behind a reservation rather than overlapping it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from service.core.cost import OpFeatures
from service.core.memory import Allocation
from service.domain.cluster import Link

__all__ = ["DeviceTimelines", "Links", "PlacedSlice", "Placement", "SliceSpec", "SliceTiming", "TransferTiming"]


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Work the scheduler places outside any replica's batching (e.g. ops of one iteration)."""

    slice_id: str
    tenant_id: str
    ops: tuple[OpFeatures, ...]
    resident_bytes: int = 0  # activations, workspace and any weights it holds while placed
    input_bytes: int = 0  # bytes it needs from input_device_id before it can start
    input_device_id: str | None = None  # None: inputs are already on the target device


@dataclass(frozen=True, slots=True)
class Placement:
    slice_id: str
    device_id: str
    start_s: float  # earliest start wanted; the slice starts later if it must wait


@dataclass(frozen=True, slots=True)
class TransferTiming:
    transfer_id: int
    src: str
    dst: str
    size_bytes: int
    start_s: float  # the link became free for it
    arrival_s: float  # start + bytes / bandwidth + latency


@dataclass(frozen=True, slots=True)
class SliceTiming:
    slice_id: str
    device_id: str
    inputs_ready_s: float  # when its inputs are on the device (commit time without inputs)
    start_s: float  # actual start: >= placement start, inputs ready and device free
    finish_s: float


@dataclass(slots=True)
class PlacedSlice:
    spec: SliceSpec
    timing: SliceTiming
    allocs: list[Allocation]  # resident bytes and the input's transfer buffer, freed at finish


class DeviceTimelines:
    """When each device is free: the end of the work committed on it, and the future windows
    ``(start_s, end_s, slice_id)`` reserved by placed slices (kept sorted)."""

    __slots__ = ("_free_at", "_reserved")

    def __init__(self, device_ids: Iterable[str]) -> None:
        ids = list(device_ids)
        self._free_at: dict[str, float] = dict.fromkeys(ids, 0.0)
        self._reserved: dict[str, list[tuple[float, float, str]]] = {d: [] for d in ids}

    def copy(self) -> DeviceTimelines:
        other = DeviceTimelines(())
        other._free_at = dict(self._free_at)
        other._reserved = {d: list(v) for d, v in self._reserved.items()}
        return other

    def free_at_s(self, device_id: str) -> float:
        """End of the work committed on the device so far, reservations included."""
        res = self._reserved[device_id]
        return max(self._free_at[device_id], res[-1][1] if res else 0.0)

    def reservations(self, device_id: str) -> list[tuple[float, float, str]]:
        return list(self._reserved[device_id])

    def earliest_window(self, device_ids: Sequence[str], t: float, duration: float) -> float:
        """Earliest start >= t at which every device is free for ``duration`` seconds."""
        free_at = self._free_at
        for d in device_ids:
            if free_at[d] > t:
                t = free_at[d]
        moved = True
        while moved:
            moved = False
            for d in device_ids:
                for start, end, _ in self._reserved[d]:
                    if start < t + duration and t < end:
                        t = end
                        moved = True
        return t

    def occupy(self, device_ids: Iterable[str], end_s: float) -> None:
        """The devices run work until ``end_s`` (a replica iteration)."""
        for d in device_ids:
            self._free_at[d] = end_s

    def reserve(self, device_id: str, start_s: float, end_s: float, slice_id: str) -> None:
        res = self._reserved[device_id]
        res.append((start_s, end_s, slice_id))
        res.sort()

    def release(self, device_id: str, slice_id: str) -> None:
        self._reserved[device_id] = [x for x in self._reserved[device_id] if x[2] != slice_id]


class Links:
    """First-come first-served directed links, and the record of every transfer sent."""

    __slots__ = ("_free_at", "_next_id", "_transfers")

    def __init__(self) -> None:
        self._free_at: dict[tuple[str, str], float] = {}
        self._transfers: dict[int, TransferTiming] = {}
        self._next_id = 0

    def copy(self) -> Links:
        other = Links()
        other._free_at = dict(self._free_at)
        other._transfers = dict(self._transfers)
        other._next_id = self._next_id
        return other

    def send(self, link: Link, size_bytes: int, now_s: float) -> TransferTiming:
        """Queue ``size_bytes`` on ``link`` at ``now_s``: it starts when the link is free."""
        key = (link.src, link.dst)
        start = max(now_s, self._free_at.get(key, 0.0))
        wire_s = size_bytes / link.bytes_per_s
        self._free_at[key] = start + wire_s
        tid = self._next_id
        self._next_id += 1
        timing = TransferTiming(tid, link.src, link.dst, size_bytes, start, start + wire_s + link.latency_us * 1e-6)
        self._transfers[tid] = timing
        return timing

    def timing(self, transfer_id: int) -> TransferTiming:
        return self._transfers[transfer_id]
