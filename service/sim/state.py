"""All mutable state of a simulated cluster in one dataclass, and how a what-if forks it.

Every field declares its fork rule next to its type (``_forked``): :meth:`SimState.fork` builds
the copy by walking :func:`dataclasses.fields`, so a new field without a rule fails the first
fork loudly (``InvariantError``) instead of being shared between the original and its fork.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from service.core.memory import Allocation, MemoryLedger
from service.domain.error import InvariantError
from service.domain.request import RequestSpec
from service.sim.replica import Live, Replica
from service.sim.resource import DeviceTimelines, Links, PlacedSlice, SliceTiming

__all__ = ["ForkScope", "SimState"]


@dataclass(frozen=True, slots=True)
class ForkScope:
    """What a fork keeps: the affected devices and replicas, at the original's time."""

    device_ids: frozenset[str]
    replica_ids: frozenset[str]
    now_s: float


ForkRule = Callable[[Any, ForkScope], Any]


def _forked(rule: ForkRule) -> dict[str, ForkRule]:
    return {"fork": rule}


def _same(value: Any, scope: ForkScope) -> Any:
    return value  # immutable values


def _copied(value: Any, scope: ForkScope) -> Any:
    return value.copy()  # containers of immutable items, and objects with their own copy()


def _ledger(value: MemoryLedger, scope: ForkScope) -> MemoryLedger:
    ledger = value.copy()
    ledger.reset_peaks(scope.now_s)  # a fork reports the peaks from the snapshot on
    return ledger


def _replicas(value: dict[str, Replica], scope: ForkScope) -> dict[str, Replica]:
    return {rid: r.clone() for rid, r in value.items() if rid in scope.replica_ids}


def _ids_kept(value: dict[str, list[str]], scope: ForkScope) -> dict[str, list[str]]:
    return {k: [x for x in ids if x in scope.replica_ids] for k, ids in value.items()}


def _slices(value: dict[str, PlacedSlice], scope: ForkScope) -> dict[str, PlacedSlice]:
    return {k: PlacedSlice(v.spec, v.timing, list(v.allocs)) for k, v in value.items()
            if v.timing.device_id in scope.device_ids}


def _draining(value: set[str], scope: ForkScope) -> set[str]:
    return value & scope.replica_ids


def _guests_kept(value: dict[str, list[tuple[str, int, int]]], scope: ForkScope) -> dict[str, list[tuple[str, int, int]]]:
    return {d: [x for x in q if x[0] in scope.replica_ids] for d, q in value.items()}


def _holders_kept(value: dict[str, str], scope: ForkScope) -> dict[str, str]:
    return {d: rid for d, rid in value.items() if rid in scope.replica_ids}


def _none_arrived(value: list[RequestSpec], scope: ForkScope) -> list[RequestSpec]:
    return []  # a fork predicts the work already in the system: it forecasts from no history


def _none_seen(value: dict[str, float], scope: ForkScope) -> dict[str, float]:
    return {}  # as ``arrived``: a fork has no history


@dataclass(slots=True, eq=False)
class SimState:
    """The simulation's mutable state (the engine's queue aside: the engine forks itself)."""

    rng: np.random.Generator = field(metadata=_forked(lambda v, s: copy.deepcopy(v)))  # router tie-breaks
    ledger: MemoryLedger = field(metadata=_forked(_ledger))
    timelines: DeviceTimelines = field(metadata=_forked(_copied))
    links: Links = field(metadata=_forked(_copied))
    replicas: dict[str, Replica] = field(metadata=_forked(_replicas))
    by_model: dict[str, list[str]] = field(metadata=_forked(_ids_kept))  # model -> replica ids
    by_device: dict[str, list[str]] = field(metadata=_forked(_ids_kept))  # device -> replica ids
    shared: bool = field(metadata=_forked(_same))  # some device hosts several replicas: freeing KV wakes the others
    served: dict[str, float] = field(metadata=_forked(_copied))  # tokens served per tenant (fair-share policies only)
    slices: dict[str, PlacedSlice] = field(metadata=_forked(_slices))  # placed and not finished
    slice_timings: dict[str, SliceTiming] = field(metadata=_forked(_copied))  # every slice ever placed
    transfer_buffers: dict[int, Allocation] = field(metadata=_forked(_copied))  # transfer id -> buffer not yet freed
    dynamic: bool = field(metadata=_forked(_same))  # replicas were added or drained at run time
    ready_at: dict[str, float] = field(metadata=_forked(_copied))  # replica -> when it takes requests (run-time replicas)
    draining: set[str] = field(metadata=_forked(_draining))
    last_active_s: dict[str, float] = field(metadata=_forked(_copied))
    arrived: list[RequestSpec] = field(metadata=_forked(_none_arrived))  # in arrival order, for load forecasts
    seen_since: dict[str, float] = field(metadata=_forked(_none_seen))  # tenant -> when its arrivals were first seen
    tokens_out: int = field(metadata=_forked(_same))  # output tokens produced so far, all replicas
    # device -> guest slices ready to run there, waiting for the owner: (replica, iteration, stage)
    guest_waiting: dict[str, list[tuple[str, int, int]]] = field(metadata=_forked(_guests_kept))
    # Executor sharing (service.sim.sharing): device -> the replica whose iteration runs there, and
    # the replicas waiting for it; replica -> its virtual time (busy seconds over weight)
    holder: dict[str, str] = field(metadata=_forked(_holders_kept))
    wanting: dict[str, list[str]] = field(metadata=_forked(_ids_kept))
    vtime: dict[str, float] = field(metadata=_forked(_copied))
    # Replicas added, removed or drained and arrivals noted so far: with the engine's counters, a
    # version of the state (SimulatedCluster.version) that what-if memos are keyed on
    changes: int = field(metadata=_forked(_same))

    @staticmethod
    def empty(device_ids: list[str], ledger: MemoryLedger, rng: np.random.Generator) -> SimState:
        return SimState(rng=rng, ledger=ledger, timelines=DeviceTimelines(device_ids), links=Links(), replicas={},
                        by_model={}, by_device={d: [] for d in device_ids}, shared=False, served={}, slices={},
                        slice_timings={}, transfer_buffers={}, dynamic=False, ready_at={}, draining=set(),
                        last_active_s={}, arrived=[], seen_since={}, tokens_out=0, guest_waiting={d: [] for d in device_ids},
                        holder={}, wanting={d: [] for d in device_ids}, vtime={}, changes=0)

    def fork(self, scope: ForkScope) -> SimState:
        """A copy sharing nothing mutable with this state, restricted to ``scope``."""
        values: dict[str, Any] = {}
        for f in fields(self):
            rule: ForkRule | None = f.metadata.get("fork")
            if rule is None:
                raise InvariantError(f"SimState.{f.name} has no fork rule")
            values[f.name] = rule(getattr(self, f.name), scope)
        return SimState(**values)

    def add_replica(self, r: Replica) -> None:
        rid = r.spec.replica_id
        self.changes += 1
        self.replicas[rid] = r
        for d in r.device_ids:
            self.by_device[d].append(rid)
        self.by_model.setdefault(r.spec.model, []).append(rid)
        self.shared = any(len(v) > 1 for v in self.by_device.values())

    def remove_replica(self, replica_id: str) -> Replica:
        r = self.replicas.pop(replica_id)
        self.changes += 1
        for d in r.device_ids:
            self.by_device[d].remove(replica_id)
        self.by_model[r.spec.model].remove(replica_id)
        self.draining.discard(replica_id)
        for wanting in self.wanting.values():
            if replica_id in wanting:
                wanting.remove(replica_id)
        self.shared = any(len(v) > 1 for v in self.by_device.values())
        return r

    def affected(self, device_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """(devices, replicas) that work on ``device_ids`` can influence: the devices plus
        every device of a replica touching one of them, closed under that relation."""
        devices = set(device_ids)
        replicas: set[str] = set()
        grew = True
        while grew:
            grew = False
            for rid, r in self.replicas.items():
                if rid not in replicas and devices.intersection(r.device_ids):
                    replicas.add(rid)
                    devices.update(r.device_ids)
                    grew = True
        return devices, replicas

    def first_token_s(self) -> dict[str, float]:
        """request_id -> when its first token came (NaN: not yet) for every request in flight."""
        out: dict[str, float] = {}
        for r in self.replicas.values():
            groups: list[Iterable[Live]] = [r.prefilling, r.waiting, r.preempted, *r.finishing.values()]
            for group in groups:
                for live in group:
                    out.setdefault(live.spec.request_id, live.first_token_s)
        return out

    def in_flight(self) -> list[tuple[str, RequestSpec]]:
        """(replica_id, request) of every request routed to a replica and not finished."""
        out: list[tuple[str, RequestSpec]] = []
        for rid, r in self.replicas.items():
            seen: set[str] = set()
            groups: list[Iterable[Live]] = [r.prefilling, r.waiting, r.preempted, *r.finishing.values()]
            for group in groups:
                for live in group:
                    if live.spec.request_id not in seen:
                        seen.add(live.spec.request_id)
                        out.append((rid, live.spec))
        return out

    def arrivals_since(self, since_s: float) -> list[RequestSpec]:
        """Requests that arrived at or after ``since_s`` (oldest first)."""
        arrived = self.arrived
        i = len(arrived)
        while i > 0 and arrived[i - 1].arrival_s >= since_s:
            i -= 1
        return arrived[i:]
