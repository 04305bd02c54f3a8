"""``Scheduler.step(now, state) -> Decision``: one placement step, for replay and the live service.

Two decisions make a schedule, each written once:

- **admission** (which queued request a replica takes next, in the queue policy's order, while
  it fits): :func:`service.core.admission.admit`, called by the simulator's batcher at every
  iteration and by the live lease book at every poll;
- **placement** (where each served model's replicas run): a :class:`PlacementPolicy` run by
  :class:`Scheduler` at every step, whose :class:`Decision` the cluster view applies
  (:meth:`ClusterView.apply`: the simulated cluster in replay, the live state in the service).

The state is a :class:`ClusterView`. Policies are pure (no I/O, no wall clock).

Names: a replica serves one **model** (``model_uid``, the unit policies reason about: a live
tenant's registered model ``tenant/model``, or a replay tenant's model ``tenant/family``) of a
**family** (``family``, the architecture that sizes weights and costs iterations) for one
**tenant** (``tenant_id``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from service.core.reason import DecisionReason, Status
from service.core.slot import ClusterState
from service.domain.cluster import ClusterSpec
from service.domain.error import InvariantError


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    replica_id: str
    tenant_id: str
    model_uid: str
    family: str
    device_ids: tuple[str, ...]
    waiting: int  # routed, not yet admitted
    running: int  # admitted (prefilling or decoding)
    guest: bool  # placed by the slice policy on devices outside the tenant's home set
    draining: bool  # takes no new requests; removed when empty
    idle_s: float  # seconds since it last had any request (0 while busy)
    # The least TTFT allowance left among its waiting requests, as a share of their targets (1:
    # just arrived, 0: due now, below 0: late); -inf where unknown: every backlog then counts.
    wait_slack_share: float = -math.inf
    # A sliced guest that yields to its devices' owners at slice boundaries (owner priority); a
    # whole guest, or a sliced one that takes turns, shares its devices first come first served.
    yields_to_owners: bool = False


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    device_id: str
    host_id: str
    free_bytes: int  # memory limit minus what is allocated now
    utilisation: float  # busy fraction over the view's recent window
    replicas: tuple[str, ...]  # replicas with weights on it


@dataclass(frozen=True, slots=True)
class SliceSize:
    """One slice of a model's cut at some quantum: its layers and what it needs resident."""

    first_layer: int
    last_layer: int  # inclusive
    weight_bytes: int
    kv_bytes_per_token: int  # KV of its layers per cached token


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    """Add a replica of ``model_uid`` (of ``family``) on ``device_ids`` (weights copied from a
    home replica over the links: it takes requests once they have arrived).

    ``stages`` (operator-level slices): ``(device_id, first_layer, last_layer)`` per slice, in
    execution order, covering every layer; ``device_ids`` are then their distinct devices in
    order. Empty: a whole replica, tensor parallel over ``device_ids``.

    ``turns`` (sliced only): the slices take turns with the owners' iterations first come first
    served, as a whole guest's iterations do; else they yield to the owners at slice boundaries
    (owner priority, :mod:`service.sim.pipeline`)."""

    model_uid: str
    family: str
    device_ids: tuple[str, ...]
    stages: tuple[tuple[str, int, int], ...] = ()
    turns: bool = False


@dataclass(frozen=True, slots=True)
class WhatIfOutcome:
    """What the simulator predicts over the next ``horizon_s`` for the work already queued."""

    horizon_s: float
    output_tokens: int  # output tokens produced within the horizon (finished requests or not)
    violations_by_tenant: dict[str, int]  # requests finishing late (or predicted late) per tenant
    memory_violations: int  # forced allocations over a device's limit
    peak_bytes: dict[str, int]  # per affected device
    # Requests in flight at the horizon and not yet late that end late when the run goes on
    # without arrivals (filled only when the what-if is asked for it: ``drain_s`` > 0).
    late_after_horizon_by_tenant: dict[str, int] = field(default_factory=dict)

    @property
    def late(self) -> int:
        """Requests predicted late within the horizon, all tenants."""
        return sum(self.violations_by_tenant.values())

    @property
    def sustained_lateness(self) -> int:
        """Late requests within the horizon plus those in flight at its end that end late after
        it: what a change leaves behind, not only what it does within the horizon."""
        return self.late + sum(self.late_after_horizon_by_tenant.values())


Verdict = Literal["accepted", "no_fit", "memory", "tenant_worse", "no_gain", "beaten"]
"""Why a what-if's change was or was not chosen (:class:`WhatIfReason`): ``accepted`` the step
commits it; ``no_fit`` its weights do not fit; ``memory`` the what-if predicts more memory
violations with it; ``tenant_worse`` a tenant has more requests predicted late with it;
``no_gain`` safe but doing no good by the policy's score; ``beaten`` safe and doing good (or,
ahead of a backlog, doing no harm), but another change scored better."""

VERDICTS: tuple[Verdict, ...] = ("accepted", "no_fit", "memory", "tenant_worse", "no_gain", "beaten")


@dataclass(frozen=True, slots=True)
class WhatIfReason:
    """A what-if's verdict in fields, not prose (for reports and audits)."""

    verdict: Verdict
    late_before: int = 0  # requests predicted late without the change, all tenants
    late_after: int = 0  # ... and with it (0 when it does not fit)
    tokens_gain: int = 0  # output tokens within the horizon, with minus without
    lateness_gain: int = 0  # sustained lateness spared (WhatIfOutcome.sustained_lateness, without minus with)
    tenant: str | None = None  # tenant_worse: the tenant (the one with most added late requests)
    late_delta: int = 0  # tenant_worse: its added late requests
    beaten_by: str | None = None  # beaten: the change chosen instead, in a line

    def as_dict(self) -> dict[str, object]:
        """The reason as plain JSON values, fields that do not apply left out."""
        out: dict[str, object] = {"verdict": self.verdict, "late_before": self.late_before,
                                  "late_after": self.late_after, "tokens_gain": self.tokens_gain,
                                  "lateness_gain": self.lateness_gain}
        if self.tenant is not None:
            out.update(tenant=self.tenant, late_delta=self.late_delta)
        if self.beaten_by is not None:
            out["beaten_by"] = self.beaten_by
        return out


@dataclass(frozen=True, slots=True)
class WhatIfRun:
    """One what-if a step ran: the change it judged, and the predictions without and with it
    (``changed`` None: the change does not fit), and why it was or was not chosen (``reason``:
    set by :func:`~service.core.placement.best_by_what_if` once the step has chosen)."""

    change: ReplicaChange
    baseline: WhatIfOutcome
    changed: WhatIfOutcome | None
    reason: WhatIfReason | None = None


@dataclass(slots=True)
class Decision:
    """What one step decided. Empty lists: nothing changes."""

    add: list[ReplicaChange] = field(default_factory=list)  # replicas to create now
    drain: list[str] = field(default_factory=list)  # replica ids to stop routing to and remove when empty
    reasons: list[DecisionReason] = field(default_factory=list)  # why, one per change, in fields (see ``notes``)
    num_whatifs: int = 0  # simulations run to decide
    whatifs: list[WhatIfRun] = field(default_factory=list)  # their figures and verdicts (the audit log's evidence)
    whatifs_skipped: int = 0  # candidate changes left unjudged because the step's what-if wall time ran out
    # placed, or nothing placed and why (None: the policy says nothing, e.g. a scripted test policy)
    status: Status | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        """Why, one line per change, as logs and reports show it: the reasons rendered
        (:meth:`DecisionReason.text`). A tuple: add a reason, not a line."""
        return tuple(r.text() for r in self.reasons)


@dataclass(slots=True)
class Applied:
    """What applying a :class:`Decision` did: the replicas created (a change whose weights do
    not fit, or whose model or devices are gone, is skipped) and drained."""

    added: list[str] = field(default_factory=list)  # new replica ids
    drained: list[str] = field(default_factory=list)
    skipped: list[ReplicaChange] = field(default_factory=list)


class ClusterView(Protocol):
    """What a placement policy may read and ask of the cluster."""

    @property
    def now_s(self) -> float: ...

    @property
    def spec(self) -> ClusterSpec: ...

    def replicas(self) -> Sequence[ReplicaInfo]: ...

    def devices(self) -> Sequence[DeviceInfo]: ...

    def weight_bytes(self, family: str) -> int:
        """Bytes of the family's weights (all devices together)."""
        ...

    def kv_reserve_bytes(self, family: str) -> int:
        """Memory a replica of the family needs besides weights to be useful (KV for a batch)."""
        ...

    def slot_state(self) -> ClusterState:
        """The candidate-slot view: devices, links, committed busy windows, resident bytes."""
        ...

    def slice_sizes(self, family: str, layers_per_slice: int) -> Sequence[SliceSize]:
        """The family's cut into slices of ``layers_per_slice`` layers, in execution order
        (``InvalidInputError`` when the quantum does not divide the layers)."""
        ...

    def iteration_s(self, family: str, tp: int) -> float:
        """A typical iteration of the family on ``tp`` devices (the slot a guest needs)."""
        ...

    def what_if(self, change: ReplicaChange, horizon_s: float, *, drain_s: float = 0.0
                ) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        """Simulate the queued work for ``horizon_s`` without and with ``change``, over the same
        affected devices: ``(baseline, changed)``; ``changed`` is ``None`` when the change cannot
        be applied (its weights do not fit). ``drain_s`` > 0: each run also goes on for up to
        ``drain_s`` without arrivals to fill ``late_after_horizon_by_tenant``."""
        ...

    def drain_what_if(self, replica_id: str, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome]:
        """Simulate the queued work for ``horizon_s`` with the guest replica kept and drained:
        ``(kept, drained)``, late requests counted for the other tenants only (what the guest
        does to them)."""
        ...

    def apply(self, decision: Decision) -> Applied:
        """Carry the decision out: drain, then add (replay and live apply through this call)."""
        ...


class PlacementPolicy(Protocol):
    name: str

    def step(self, now_s: float, state: ClusterView) -> Decision: ...


@dataclass
class Scheduler:
    """Runs a placement policy and checks its decisions. (The queue policy orders each
    replica's queue and is consulted by admission, not here.)"""

    placement: PlacementPolicy

    @property
    def name(self) -> str:
        return self.placement.name

    def step(self, now_s: float, state: ClusterView) -> Decision:
        decision = self.placement.step(now_s, state)
        self._check(decision, state)
        return decision

    def step_and_apply(self, now_s: float, state: ClusterView) -> tuple[Decision, Applied]:
        """One step, then the view applies it (replay; the live service steps in a worker thread
        and applies on its event loop)."""
        decision = self.step(now_s, state)
        return decision, state.apply(decision)

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
