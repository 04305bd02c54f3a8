"""``Scheduler.step(now, state) -> Decision``: one scheduling step, for replay and the live service.

A scheduler is a **queue policy** (which request a replica admits next: FIFO, SJF, aging, ...)
plus a **placement policy** (where each tenant's work runs). Replicas consult the queue policy
at every admission; the placement policy runs at every step and returns replica changes. The
state is a :class:`ClusterView`: the simulated cluster in replay, the service's in-memory
mirror of the GMG live. Both the view and the policies are pure (no I/O, no wall clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.core.queue import QueuePolicy
from service.core.slot import ClusterState
from service.domain.cluster import ClusterSpec
from service.domain.error import InvariantError


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    replica_id: str
    tenant_id: str
    model: str
    device_ids: tuple[str, ...]
    waiting: int  # routed, not yet admitted
    running: int  # admitted (prefilling or decoding)
    guest: bool  # placed by the slice policy on devices outside the tenant's home set
    draining: bool  # takes no new requests; removed when empty
    idle_s: float  # seconds since it last had any request (0 while busy)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    device_id: str
    host_id: str
    free_bytes: int  # memory limit minus what is allocated now
    utilisation: float  # busy fraction over the view's recent window
    replicas: tuple[str, ...]  # replicas with weights on it


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    """Add a replica of ``tenant_id``'s model on ``device_ids`` (weights copied from a home
    replica over the links: it takes requests once they have arrived)."""

    tenant_id: str
    model: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WhatIfOutcome:
    """What the simulator predicts over the next ``horizon_s`` for the work already queued."""

    horizon_s: float
    output_tokens: int  # output tokens produced within the horizon (finished requests or not)
    violations_by_tenant: dict[str, int]  # requests finishing late (or predicted late) per tenant
    memory_violations: int  # forced allocations over a device's limit
    peak_bytes: dict[str, int]  # per affected device


@dataclass(slots=True)
class Decision:
    """What one step decided. Empty lists: nothing changes."""

    add: list[ReplicaChange] = field(default_factory=list)  # replicas to create now
    drain: list[str] = field(default_factory=list)  # replica ids to stop routing to and remove when empty
    notes: list[str] = field(default_factory=list)  # why, one line per change (for logs and reports)
    num_whatifs: int = 0  # simulations run to decide


class ClusterView(Protocol):
    """What a placement policy may read and ask of the cluster."""

    @property
    def now_s(self) -> float: ...

    @property
    def spec(self) -> ClusterSpec: ...

    def replicas(self) -> Sequence[ReplicaInfo]: ...

    def devices(self) -> Sequence[DeviceInfo]: ...

    def weight_bytes(self, model: str) -> int:
        """Bytes of the model's weights (all devices together)."""
        ...

    def kv_reserve_bytes(self, model: str) -> int:
        """Memory a replica of the model needs besides weights to be useful (KV for a batch)."""
        ...

    def slot_state(self) -> ClusterState:
        """The candidate-slot view: devices, links, committed busy windows, resident bytes."""
        ...

    def iteration_s(self, model: str, tp: int) -> float:
        """A typical iteration of the model on ``tp`` devices (the slot a guest needs)."""
        ...

    def what_if(self, change: ReplicaChange, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        """Simulate the queued work for ``horizon_s`` without and with ``change``, over the same
        affected devices: ``(baseline, changed)``; ``changed`` is ``None`` when the change cannot
        be applied (its weights do not fit)."""
        ...


class PlacementPolicy(Protocol):
    name: str

    def step(self, now_s: float, state: ClusterView) -> Decision: ...


@dataclass
class Scheduler:
    """A queue policy and a placement policy, composed; either combines with any other."""

    queue: QueuePolicy
    placement: PlacementPolicy

    @property
    def name(self) -> str:
        return f"{self.queue.name}/{self.placement.name}"

    def step(self, now_s: float, state: ClusterView) -> Decision:
        decision = self.placement.step(now_s, state)
        self._check(decision, state)
        return decision

    @staticmethod
    def _check(decision: Decision, state: ClusterView) -> None:
        """Invariants of a decision: it adds replicas only on known devices and drains only
        known replicas; ``InvariantError`` otherwise (a policy bug; checked under ``-O`` too)."""
        known = {d.device_id for d in state.devices()}
        for change in decision.add:
            unknown = set(change.device_ids) - known
            if unknown:
                raise InvariantError(f"decision adds a replica on unknown devices {sorted(unknown)}: {change}")
        ids = {r.replica_id for r in state.replicas()}
        stray = set(decision.drain) - ids
        if stray:
            raise InvariantError(f"decision drains unknown replicas {sorted(stray)}")
