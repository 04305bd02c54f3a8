"""The ``slice-fixed`` placement policy (a named baseline: the ``slice`` policy, one placement
over every granularity, is :mod:`service.core.granularity`): operator-level slices of backlogged
tenants' iterations in other tenants' idle windows, cut at one fixed quantum.

At every step, for each model with a backlog, the policy plans where the slices of its coming
iterations run: it cuts the model at a quantum it chooses (the most layers per slice whose
predicted run time for a typical iteration stays within ``slice_budget_s``, so an owner waits
at most that long for a guest slice), then walks the cut in execution order, asking the
candidate-slot search for each slice with the previous slice's device and end time as its input
dependency (the first slice's input comes from a home device), and keeps each slice on the
previous slice's device while its memory lasts, else moves to the best other slot (same host
first, then the least utilised device, the earliest start, the most headroom). Devices the model
already runs on are not candidates. A plan needs every slice placed.

Each plan is judged by the what-if simulator (:meth:`ClusterView.what_if`, which runs the sliced
replica with owner priority at slice boundaries, see :mod:`service.sim.pipeline`); the policy
commits the plan that does most good over the horizon, SLAs first (fewest requests predicted
late), then output tokens, with no tenant's predicted SLA violations up and no memory
violation. Weights of the offloaded layers are copied once from a home device (charged to the
links) and freed when the sliced replica is drained: when it has been idle ``idle_drain_s``, or
when an owner of one of its devices has a backlog and the device lacks the memory for the
owner's KV reserve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from service.core.framework import (
    AddChosen,
    Backlog,
    Candidates,
    Figures,
    GuestDrains,
    NoClosedDevices,
    OwnerRule,
    PlacementStage,
    PlacementSteps,
    StepContext,
    WhatIfJudge,
)
from service.core.reason import ReasonCode
from service.core.scheduler import ClusterView, Decision, ReplicaChange, ReplicaInfo, SliceSize
from service.core.slot import InputDep, Slot, SlotQuery, find_slots_in_memory

Stage = tuple[str, int, int]  # (device_id, first_layer, last_layer)
SlotSearch = Callable[[SlotQuery], list[Slot]]
PlanFinder = Callable[[ClusterView, str, int, float], list[tuple[Stage, ...]]]
"""``(state, model_uid, k, slice_budget_s) -> plans, best first``: where a model's slices may go."""

_USABLE = 0.9  # of a device's free memory a plan may fill: the rest stays for its owner's growth


def quantum(iteration_s: float, num_layers: int, budget_s: float) -> int:
    """The most layers per slice (a divisor of ``num_layers``) whose share of an iteration of
    ``iteration_s`` seconds fits in ``budget_s``; at least one layer."""
    best = 1
    for q in range(1, num_layers + 1):
        if num_layers % q == 0 and iteration_s * q / num_layers <= budget_s:
            best = q
    return best


def slice_plans(state: ClusterView, model_uid: str, k: int, budget_s: float,
                search: SlotSearch | None = None) -> list[tuple[Stage, ...]]:
    """Up to ``k`` dependency- and memory-safe plans for one sliced replica of ``model_uid``
    at the quantum :func:`quantum` chooses for ``budget_s`` (see the module doc)."""
    mine = [r for r in state.replicas() if r.model_uid == model_uid and not r.draining]
    if not mine:
        return []
    family = mine[0].family
    num_layers = len(state.slice_sizes(family, 1))
    return plans_at_quantum(state, model_uid, quantum(state.iteration_s(family, 1), num_layers, budget_s), k, search)


def plans_at_quantum(state: ClusterView, model_uid: str, layers_per_slice: int, k: int,
                     search: SlotSearch | None = None) -> list[tuple[Stage, ...]]:
    """Up to ``k`` dependency- and memory-safe plans for one sliced replica of ``model_uid`` cut
    into slices of ``layers_per_slice`` layers (a divisor of its layers); two rankings of the
    slots: least utilised first, most headroom first. A slice stays on the previous slice's
    device while its memory lasts, so one plan may hold the whole model on one device or spread
    its layers over the free memory of several. ``search`` answers the slot queries: in memory
    over ``state.slot_state()`` by default (replay), the Cypher query over the GMG live."""
    mine = [r for r in state.replicas() if r.model_uid == model_uid and not r.draining]
    if not mine:
        return []
    family = mine[0].family
    num_layers = len(state.slice_sizes(family, 1))
    it_s = state.iteration_s(family, 1)
    q = layers_per_slice
    sizes = state.slice_sizes(family, q)
    if search is None:
        slots_state = state.slot_state()

        def search(query: SlotQuery) -> list[Slot]:
            return find_slots_in_memory(slots_state, query)
    devices = {d.device_id: d for d in state.devices()}
    taken = {d for r in mine for d in r.device_ids}
    kv_reserve = state.kv_reserve_bytes(family) * q // num_layers
    slice_s = it_s * q / num_layers
    plans: list[tuple[Stage, ...]] = []
    rankings: tuple[Callable[[Slot], tuple[float, ...]], ...] = (
        lambda s: (round(devices[s.device_id].utilisation, 1), s.start_s, -s.headroom_bytes),
        lambda s: (-s.headroom_bytes, s.start_s),
    )
    for rank in rankings:
        if len(plans) >= k:
            break
        plan = _plan(state, mine[0], sizes, kv_reserve, slice_s, taken, search, rank)
        if plan and plan not in plans:
            plans.append(plan)
    return plans[:k]


def _plan(state: ClusterView, home: ReplicaInfo, sizes: Sequence[SliceSize], kv_reserve: int, slice_s: float,
          taken: set[str], search: SlotSearch, rank: Callable[[Slot], tuple[float, ...]]) -> tuple[Stage, ...]:
    """Walk the cut in order, one slot query per slice with the previous slice as its input."""
    host_of = {d.device_id: d.host_id for d in state.devices()}
    room = {d.device_id: int(d.free_bytes * _USABLE) for d in state.devices()}
    kinds = {d.kind for d in state.spec.devices}
    prev_dev, prev_end = home.device_ids[0], state.now_s
    act = kv_reserve  # what the slice holds while it runs besides weights: its KV reserve
    stages: list[Stage] = []
    for size in sizes:
        need = size.weight_bytes + kv_reserve
        query = SlotQuery(state.spec.name, home.tenant_id, home.model_uid, state.now_s,
                          dict.fromkeys(kinds, slice_s), slice_bytes=act, weight_bytes=size.weight_bytes,
                          needs_weights=True, input_deps=(InputDep(prev_dev, prev_end, act),), k=len(host_of))
        slots = [s for s in search(query) if s.device_id not in taken and room[s.device_id] >= need]
        if not slots:
            return ()
        same = [s for s in slots if s.device_id == prev_dev]
        near = [s for s in slots if host_of[s.device_id] == host_of[prev_dev]]
        slot = min(same or near or slots, key=lambda s: (*rank(s), s.device_id))
        room[slot.device_id] -= need
        stages.append((slot.device_id, size.first_layer, size.last_layer))
        prev_dev, prev_end = slot.device_id, slot.start_s + slice_s
    return tuple(stages)


@dataclass(frozen=True, slots=True)
class SlicedPlans:
    """Filter: up to ``max_candidates`` sliced plans per model wanting room, at the quantum
    ``slice_budget_s`` sets (``find_plans``: :func:`slice_plans` by default)."""

    find_plans: PlanFinder
    max_candidates: int = 2
    slice_budget_s: float = 0.02

    def candidates(self, ctx: StepContext) -> Candidates:
        return Candidates(self.changes(ctx.state, ctx.pressing, ctx.family_of), tuple(ctx.pressing))

    def changes(self, state: ClusterView, pressing: Sequence[str], family_of: dict[str, str]
                ) -> Iterator[ReplicaChange]:
        return (ReplicaChange(model, family_of[model], tuple(dict.fromkeys(d for d, _, _ in plan)), plan)
                for model in pressing
                for plan in self.find_plans(state, model, self.max_candidates, self.slice_budget_s))


@dataclass(frozen=True, slots=True)
class OwnerMemory:
    """Drain rule: a guest leaves a device whose owner has ``min_backlog`` waiting while the
    device lacks the memory for the owner's KV reserve (owner priority keeps the owner's
    iterations first already)."""

    min_backlog: int = 2

    def for_step(self, ctx: StepContext) -> OwnerRule:
        state = ctx.state
        free = {d.device_id: d.free_bytes for d in state.devices()}
        code: ReasonCode = "drain_owner_memory"

        def reason(guest: ReplicaInfo, owner: ReplicaInfo, device: str) -> tuple[ReasonCode, Figures] | None:
            if owner.waiting < self.min_backlog:
                return None
            reserve = state.kv_reserve_bytes(owner.family)
            if free[device] >= reserve:
                return None
            return code, {"owner": owner.model_uid, "waiting": owner.waiting, "device": device,
                          "free_bytes": free[device], "kv_reserve_bytes": reserve}
        return reason


@dataclass
class SlicePlacementPolicy:
    """Operator-level slices of backlogged tenants, judged by the what-if (see module doc):
    :class:`SlicedPlans` judged by a :class:`WhatIfJudge`, guests released by :class:`OwnerMemory`.
    ``find_plans`` answers candidate plans: :func:`slice_plans` over the view's in-memory slot
    state by default (replay). The fields are read once, when the policy is built."""

    horizon_s: float = 20.0  # what-if look-ahead
    max_candidates: int = 2  # what-ifs per backlogged model and step
    min_backlog: int = 2  # waiting requests before a model looks for more room
    idle_drain_s: float = 30.0  # a sliced replica idle this long is drained
    max_guests_per_tenant: int = 4  # sliced replicas per served model
    slice_budget_s: float = 0.02  # the quantum: a slice's typical run time stays within this
    find_plans: PlanFinder = slice_plans
    name: str = "slice-fixed"
    steps: PlacementSteps = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.steps = PlacementSteps(
            self.name, drains=GuestDrains(self.idle_drain_s, OwnerMemory(self.min_backlog)), gate=NoClosedDevices(),
            backlog=Backlog(self.min_backlog, self.max_guests_per_tenant),
            stages=(PlacementStage(SlicedPlans(self.find_plans, self.max_candidates, self.slice_budget_s),
                          WhatIfJudge(self.horizon_s)),),
            bind=AddChosen())

    def step(self, now_s: float, state: ClusterView) -> Decision:
        return self.steps.step(now_s, state)


def slice_policy(*, find_plans: PlanFinder | None = None, horizon_s: float = 20.0, max_candidates: int = 2, min_backlog: int = 2, idle_drain_s: float = 30.0,
                 max_guests_per_tenant: int = 4, slice_budget_s: float = 0.02) -> SlicePlacementPolicy:
    """The fixed-quantum slice policy (``slice-fixed``); ``find_plans`` is the plan search
    (default: in memory)."""
    return SlicePlacementPolicy(horizon_s=horizon_s, max_candidates=max_candidates, min_backlog=min_backlog,
                                idle_drain_s=idle_drain_s, max_guests_per_tenant=max_guests_per_tenant,
                                slice_budget_s=slice_budget_s, find_plans=find_plans or slice_plans)
