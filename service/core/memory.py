"""Per-device memory ledger: who holds how many bytes where, now.

Pure bookkeeping, no clock: callers pass ``at_s`` so peaks and violations carry a time.
Kinds: resident ``weights``, ``kv_cache``, live ``activation`` (within and between slices) and
``transfer_buffer``. The limit of a device is its capacity minus a safety margin.

Contract:

* :meth:`MemoryLedger.allocate` and :meth:`MemoryLedger.resize` refuse (return ``None``, change
  nothing) when the device would go above its limit;
* :meth:`MemoryLedger.overflow` is the path for allocations the caller must make anyway (work
  already running that grows): it always allocates and, when the limit is exceeded, appends a
  :class:`MemoryViolation`; overflow is never absorbed silently;
* ``used_bytes(d) == sum of live allocations on d`` and ``peak_bytes(d) >= used_bytes(d)`` hold
  after every call (:meth:`MemoryLedger.check_invariants`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

MemoryKind = Literal["weights", "kv_cache", "activation", "transfer_buffer"]
MEMORY_KINDS: tuple[str, ...] = ("weights", "kv_cache", "activation", "transfer_buffer")


@dataclass(frozen=True, slots=True)
class Allocation:
    """A live block of ``size_bytes`` on ``device_id``; ``alloc_id`` is unique per ledger."""

    alloc_id: int
    device_id: str
    kind: str
    owner: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryViolation:
    """A forced allocation that took ``device_id`` to ``used_bytes`` above ``limit_bytes``."""

    device_id: str
    at_s: float
    kind: str
    owner: str
    requested_bytes: int  # the growth that was forced
    used_bytes: int  # usage right after the forced allocation
    limit_bytes: int  # capacity minus margin


class MemoryLedger:
    """Allocations per device. ``margin_fraction`` of each capacity is kept free (the limit)."""

    def __init__(self, capacities_bytes: Mapping[str, int], *, margin_fraction: float = 0.05) -> None:
        if not 0.0 <= margin_fraction < 1.0:
            raise ValueError(f"margin_fraction must be in [0, 1), got {margin_fraction}")
        self.margin_fraction = margin_fraction
        self._capacity = dict(capacities_bytes)
        self._limit = {d: int(c * (1.0 - margin_fraction)) for d, c in self._capacity.items()}
        self._used = dict.fromkeys(self._capacity, 0)
        self._peak = dict.fromkeys(self._capacity, 0)
        self._peak_at = dict.fromkeys(self._capacity, 0.0)
        self._live: dict[int, Allocation] = {}
        self._next_id = 0
        self.violations: list[MemoryViolation] = []

    # ---- queries ------------------------------------------------------------------------
    @property
    def device_ids(self) -> list[str]:
        return list(self._capacity)

    def capacity_bytes(self, device_id: str) -> int:
        return self._capacity[device_id]

    def limit_bytes(self, device_id: str) -> int:
        return self._limit[device_id]

    def used_bytes(self, device_id: str) -> int:
        return self._used[device_id]

    def free_bytes(self, device_id: str) -> int:
        """Bytes that may still be allocated before the limit (negative after an overflow)."""
        return self._limit[device_id] - self._used[device_id]

    def peak_bytes(self, device_id: str) -> int:
        return self._peak[device_id]

    def peak_at_s(self, device_id: str) -> float:
        return self._peak_at[device_id]

    def allocations(self, device_id: str | None = None) -> list[Allocation]:
        return [a for a in self._live.values() if device_id is None or a.device_id == device_id]

    def used_by_kind(self, device_id: str) -> dict[str, int]:
        out = dict.fromkeys(MEMORY_KINDS, 0)
        for a in self._live.values():
            if a.device_id == device_id:
                out[a.kind] = out.get(a.kind, 0) + a.size_bytes
        return out

    # ---- changes ------------------------------------------------------------------------
    def allocate(self, device_id: str, kind: str, owner: str, size_bytes: int, *,
                 at_s: float = 0.0) -> Allocation | None:
        """A new allocation, or ``None`` (nothing changed) when it would exceed the limit."""
        if size_bytes < 0:
            raise ValueError(f"negative allocation of {size_bytes} bytes for {owner!r}")
        if self._used[device_id] + size_bytes > self._limit[device_id]:
            return None
        return self._add(device_id, kind, owner, size_bytes, at_s)

    def overflow(self, device_id: str, kind: str, owner: str, size_bytes: int, *,
                 at_s: float = 0.0) -> Allocation:
        """Allocate regardless of the limit; record a violation if the limit is exceeded."""
        if size_bytes < 0:
            raise ValueError(f"negative allocation of {size_bytes} bytes for {owner!r}")
        alloc = self._add(device_id, kind, owner, size_bytes, at_s)
        self._check_limit(alloc, size_bytes, at_s)
        return alloc

    def resize(self, alloc: Allocation, size_bytes: int, *, at_s: float = 0.0,
               force: bool = False) -> Allocation | None:
        """The allocation with a new size (same id), or ``None`` (unchanged) when growing it
        would exceed the limit. ``force=True`` grows anyway and records the violation."""
        if size_bytes < 0:
            raise ValueError(f"negative size {size_bytes} for {alloc.owner!r}")
        current = self._live.get(alloc.alloc_id)
        if current is None:
            raise KeyError(f"allocation {alloc.alloc_id} ({alloc.owner}) is not live")
        growth = size_bytes - current.size_bytes
        device_id = current.device_id
        if growth > 0 and not force and self._used[device_id] + growth > self._limit[device_id]:
            return None
        new = Allocation(current.alloc_id, device_id, current.kind, current.owner, size_bytes)
        self._live[new.alloc_id] = new
        used = self._used[device_id] + growth
        self._used[device_id] = used
        if used > self._peak[device_id]:
            self._peak[device_id] = used
            self._peak_at[device_id] = at_s
        if growth > 0:
            self._check_limit(new, growth, at_s)
        return new

    def free(self, alloc: Allocation) -> None:
        """Release a live allocation (``KeyError`` if it is not live: a double free is a bug)."""
        current = self._live.pop(alloc.alloc_id)
        self._used[current.device_id] -= current.size_bytes

    def reset_peaks(self, at_s: float = 0.0) -> None:
        """Start peak tracking afresh from current usage (a what-if's window)."""
        for d, used in self._used.items():
            self._peak[d] = used
            self._peak_at[d] = at_s

    def copy(self) -> MemoryLedger:
        """An independent ledger with the same allocations, peaks and violations."""
        other = MemoryLedger.__new__(MemoryLedger)
        other.margin_fraction = self.margin_fraction
        other._capacity = dict(self._capacity)
        other._limit = dict(self._limit)
        other._used = dict(self._used)
        other._peak = dict(self._peak)
        other._peak_at = dict(self._peak_at)
        other._live = dict(self._live)  # allocations are immutable: sharing them is safe
        other._next_id = self._next_id
        other.violations = list(self.violations)
        return other

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the device whose books do not add up."""
        recount = dict.fromkeys(self._capacity, 0)
        for a in self._live.values():
            if a.size_bytes < 0:
                raise AssertionError(f"allocation {a.alloc_id} has negative size")
            recount[a.device_id] += a.size_bytes
        for d, used in self._used.items():
            if used != recount[d]:
                raise AssertionError(f"device {d}: used {used} != sum of allocations {recount[d]}")
            if self._peak[d] < used:
                raise AssertionError(f"device {d}: peak {self._peak[d]} below usage {used}")
            if used > self._limit[d] and not any(v.device_id == d for v in self.violations):
                raise AssertionError(f"device {d}: above its limit with no recorded violation")

    # ---- internals ----------------------------------------------------------------------
    def _add(self, device_id: str, kind: str, owner: str, size_bytes: int, at_s: float) -> Allocation:
        alloc = Allocation(self._next_id, device_id, kind, owner, size_bytes)
        self._next_id += 1
        self._live[alloc.alloc_id] = alloc
        used = self._used[device_id] + size_bytes
        self._used[device_id] = used
        if used > self._peak[device_id]:
            self._peak[device_id] = used
            self._peak_at[device_id] = at_s
        return alloc

    def _check_limit(self, alloc: Allocation, growth: int, at_s: float) -> None:
        used = self._used[alloc.device_id]
        limit = self._limit[alloc.device_id]
        if used > limit:
            self.violations.append(MemoryViolation(alloc.device_id, at_s, alloc.kind, alloc.owner,
                                                   growth, used, limit))
