"""Placement policies: where each tenant's work runs.

``container`` stands for today's practice and is made strong: every tenant's model gets a
static set of whole devices sized from the tenant's share of the offered load (largest
remainder over the work each tenant brings, at least one replica each, tensor parallel where the
weights need it), with continuous batching and memory-aware admission inside, as vLLM does.
It is sized with the *true* average load of the run, which a real operator only estimates.

``replica`` (the baseline for operator-level slices, :mod:`service.core.slicing`) starts from
the same home devices and then fills idle windows across tenants with whole guest replicas: at
every step it looks for tenants with a backlog, asks the candidate-slot search for devices
with memory headroom where the tenant's weights can be made resident (a copy over NVLink or
the network, charged by the simulator), judges the best candidates with the what-if
simulator, and commits the one that does most good over the horizon (fewest requests predicted
late, then most output tokens) without adding an SLA violation for any tenant or any memory
violation. No guest goes onto the home of a model that has a guest of its own elsewhere (a swap
of time between two homes). Guest replicas share their devices with the owners' work iteration
by iteration (a device runs one slice at a time), and are drained when idle or when an owner of
their device has a backlog that presses (:func:`owner_pressed`); with ``confirm_drains`` (the
live service) only where a drain what-if predicts the guest makes the other tenants' requests
late (:func:`confirmed_drain`). It never places work the simulator predicts would overflow memory.

With ``headroom_utilisation`` set (the live service sets it; replay leaves it off), a model with
no guest whose home devices are at least that busy gets one *ahead of* a backlog, on devices
less busy than that, when the what-if predicts no tenant worse off: bursts then find room
already loaded. Measured live: a backlog-triggered guest came 10-25 s into the run (a step,
a what-if and the weights' load after the burst began), and the burst it came for was lost.

``replica`` is composed of :mod:`service.core.framework`'s parts (filter, score, bind) and of its
own: the filters :class:`GuestReplicas` and :class:`HeadroomGuests`, the drain rule
:class:`OwnerPressed`, the gate :class:`OwnersRecentlyPressed`; ``slice`` reuses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from service.core.framework import (
    AddChosen,
    Backlog,
    Candidates,
    Figures,
    GuestDrains,
    OwnerRule,
    PlacementStage,
    PlacementSteps,
    StepContext,
    WhatIfChoice,
    WhatIfJudge,
    WhatIfScore,
    best_by_what_if,
    describe,
    drain_guests,
    is_safe,
    late_then_tokens,
    pressing_models,
    sustained_then_tokens,
    unsafe_reason,
)
from service.core.reason import ReasonCode, Status, pressed_words, share_or_none
from service.core.scheduler import ClusterView, Decision, PlacementPolicy, ReplicaChange, ReplicaInfo
from service.core.slot import InputDep, Slot, SlotQuery, find_slots_in_memory
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError

TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class TenantDemand:
    tenant_id: str
    model: str
    device_s_per_s: float  # work offered per second, in seconds of one device (>= 0)


def min_tp(weight_bytes: int, reserve_bytes: int, device_mem_bytes: int, usable_fraction: float = 0.9) -> int:
    """Smallest tensor-parallel degree whose per-device weights plus reserve fit."""
    for tp in TP_DEGREES:
        if (weight_bytes + reserve_bytes) / tp <= device_mem_bytes * usable_fraction:
            return tp
    raise InvalidInputError(f"a model of {weight_bytes / 2**30:.0f} GiB does not fit on 8 devices")


def container_replicas(spec: ClusterSpec, demands: Sequence[TenantDemand], *,
                       weight_bytes: Callable[[str], int], reserve_bytes: Callable[[str], int]
                       ) -> list[tuple[str, str, tuple[str, ...]]]:
    """Static whole-device allocation: ``(tenant_id, model, device_ids)`` per replica.

    Devices are shared out in proportion to each tenant's offered work (largest remainder, in
    units of the tenant's tensor-parallel group), every tenant getting at least one group; a
    group never spans hosts. Raises :class:`InvalidInputError` when the tenants' minimum groups
    do not fit the cluster.
    """
    mem = min(d.mem_bytes for d in spec.devices)
    tp = {t.tenant_id: min_tp(weight_bytes(t.model), reserve_bytes(t.model), mem) for t in demands}
    need = sum(tp.values())
    if need > len(spec.devices):
        raise InvalidInputError(
            f"the cluster's {len(spec.devices)} devices cannot hold one replica per tenant "
            f"({need} devices needed: " + ", ".join(f"{t.tenant_id} x{tp[t.tenant_id]}" for t in demands) + ")")
    groups = dict.fromkeys(tp, 1)
    spare = len(spec.devices) - need
    total = sum(t.device_s_per_s for t in demands) or 1.0
    # Largest remainder over the spare devices, in whole groups of each tenant's TP degree.
    ideal = {t.tenant_id: len(spec.devices) * t.device_s_per_s / total / tp[t.tenant_id] for t in demands}
    while spare > 0:
        fits = [t for t in tp if tp[t] <= spare]
        if not fits:
            break
        best = max(fits, key=lambda t: (ideal[t] - groups[t], -tp[t], t))
        groups[best] += 1
        spare -= tp[best]
    by_host: dict[str, list[str]] = {}
    for d in spec.devices:
        by_host.setdefault(d.host_id, []).append(d.device_id)
    out: list[tuple[str, str, tuple[str, ...]]] = []
    model_of = {t.tenant_id: t.model for t in demands}
    for tenant in sorted(tp, key=lambda t: (-tp[t], t)):  # big groups first, they fragment worst
        for _ in range(groups[tenant]):
            host = next((h for h, free in by_host.items() if len(free) >= tp[tenant]), None)
            if host is None:
                raise InvalidInputError(f"no host has {tp[tenant]} free devices for {tenant}'s {model_of[tenant]}")
            ids = tuple(by_host[host][: tp[tenant]])
            del by_host[host][: tp[tenant]]
            out.append((tenant, model_of[tenant], ids))
    return out


__all__ = ["WhatIfChoice", "WhatIfScore", "best_by_what_if", "describe", "drain_guests", "is_safe",
           "late_then_tokens", "pressing_models", "sustained_then_tokens", "unsafe_reason"]  # the framework's, kept here


class ContainerPlacementPolicy:
    """Static: the initial allocation is the whole decision."""

    name = "container"

    def step(self, now_s: float, state: ClusterView) -> Decision:
        return Decision(status=Status("static"))


DeviceFinder = Callable[[ClusterView, str, int], list[tuple[str, ...]]]
"""``(state, model_uid, k) -> device groups, best first``: where a guest replica may go."""


# ---- replica's parts ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GuestReplicas:
    """Filter: whole guest replicas for the models that want room, on the device groups
    ``find_devices`` answers (``max_candidates`` per model), none on a closed device."""

    find_devices: DeviceFinder
    max_candidates: int = 3

    def candidates(self, ctx: StepContext) -> Candidates:
        return Candidates(self.changes(ctx.state, ctx.pressing, ctx.family_of, ctx.closed), tuple(ctx.pressing))

    def changes(self, state: ClusterView, pressing: Sequence[str], family_of: dict[str, str],
                closed: set[str]) -> Iterator[ReplicaChange]:
        return (ReplicaChange(model, family_of[model], group) for model in pressing
                for group in self.find_devices(state, model, self.max_candidates)
                if not closed.intersection(group))


@dataclass(frozen=True, slots=True)
class HeadroomGuests:
    """Filter: a guest *ahead of* a backlog for each model with no guest whose home is at least
    ``utilisation`` busy (:func:`headroom_models`, the models wanting room excluded), on devices
    less busy than that."""

    find_devices: DeviceFinder
    utilisation: float
    max_candidates: int = 3

    def candidates(self, ctx: StepContext) -> Candidates:
        state, closed, threshold = ctx.state, ctx.closed, self.utilisation
        busy = {d.device_id: d.utilisation for d in state.devices()}
        hot = headroom_models(ctx.replicas, busy, threshold, exclude=set(ctx.pressing))
        return Candidates((ReplicaChange(model, family, group) for model, family in hot.items()
                           for group in self.find_devices(state, model, self.max_candidates)
                           if not closed.intersection(group) and max(busy.get(d, 0.0) for d in group) < threshold),
                          tuple(hot))


@dataclass(frozen=True, slots=True)
class OwnerPressed:
    """Drain rule: a guest leaves a device whose owner's backlog presses (:func:`owner_pressed`);
    with ``confirm``, only where a drain what-if over ``horizon_s`` predicts the guest makes the
    other tenants' requests late (:func:`confirmed_drain`, one per guest and step)."""

    min_backlog: int = 2
    yield_share: float = 0.5
    confirm: bool = False
    horizon_s: float = 20.0

    def for_step(self, ctx: StepContext) -> OwnerRule:
        verdicts: dict[str, Figures | None] = {}  # guest -> why to drain it (one drain what-if per guest)

        code: ReasonCode = "drain_owner_pressed"

        def reason(guest: ReplicaInfo, owner: ReplicaInfo, device: str) -> tuple[ReasonCode, Figures] | None:
            why = owner_pressure(owner, self.min_backlog, self.yield_share)
            if why is not None and self.confirm:
                if guest.replica_id not in verdicts:
                    verdicts[guest.replica_id] = confirmed_drain(ctx.state, guest, why, self.horizon_s, ctx.decision)
                why = verdicts[guest.replica_id]
            return None if why is None else (code, why)
        return reason


@dataclass
class OwnersRecentlyPressed:
    """Gate: no guest goes where an owner presses now, or pressed within ``horizon_s``: the
    what-if judges a guest that stays for the horizon, and an owner whose backlog comes and goes
    would drain it at its next surge (measured live: a batch tenant's guest on the saturated
    tenant's executor was added and drained five times in a minute); nor on the home of a model
    that has a guest elsewhere: it needs its home and more, and a guest there swaps time between
    two homes (measured live: acme's guest on the light tenants' executor made their backlog, and
    their guests on acme's home took its time back)."""

    min_backlog: int = 2
    yield_share: float = 0.5
    horizon_s: float = 20.0
    pressed_at: dict[str, float] = field(default_factory=dict, repr=False)  # device -> when an owner last pressed

    def closed(self, now_s: float, replicas: Sequence[ReplicaInfo]) -> set[str]:
        for r in replicas:
            if not r.guest and not r.draining and owner_pressed(r, self.min_backlog, self.yield_share):
                self.pressed_at.update(dict.fromkeys(r.device_ids, now_s))
        closed = {d for d, at in self.pressed_at.items()
                  if 0.0 <= now_s - at < self.horizon_s}  # a clock that restarted forgets
        return closed | spilled_homes(replicas)


@dataclass
class ReplicaPlacementPolicy:
    """Fill idle windows across tenants with guest replicas, judged by the what-if simulator
    (see module doc): :class:`GuestReplicas` (and :class:`HeadroomGuests`) judged by a
    :class:`WhatIfJudge`, guests released by :class:`OwnerPressed`, devices closed by
    :class:`OwnersRecentlyPressed`.
    ``find_devices`` answers candidate device groups: :func:`candidate_groups` over the view's
    in-memory slot state by default (replay); the Cypher search over the GMG live. The fields
    are read once, when the policy is built."""

    horizon_s: float = 20.0  # what-if look-ahead
    max_candidates: int = 3  # what-ifs per backlogged model and step
    min_backlog: int = 2  # waiting requests before a model looks for more room
    idle_drain_s: float = 30.0  # a guest replica idle this long is drained
    max_guests_per_tenant: int = 4  # guest replicas per served model
    yield_share: float = 0.5  # an owner's backlog presses once a waiting request has this share of its TTFT allowance left
    headroom_utilisation: float | None = None  # a guest ahead of a backlog for homes this busy (None: off)
    confirm_drains: bool = False  # drain a guest for a pressing owner only if the what-if says it makes others late
    find_devices: DeviceFinder = field(default_factory=lambda: candidate_groups)
    name: str = "replica"
    steps: PlacementSteps = field(init=False, repr=False)

    def __post_init__(self) -> None:
        stages = [PlacementStage(GuestReplicas(self.find_devices, self.max_candidates), WhatIfJudge(self.horizon_s))]
        if self.headroom_utilisation is not None:
            stages.append(PlacementStage(HeadroomGuests(self.find_devices, self.headroom_utilisation, self.max_candidates),
                                WhatIfJudge(self.horizon_s, ahead=True)))
        self.steps = PlacementSteps(
            self.name,
            drains=GuestDrains(self.idle_drain_s, OwnerPressed(self.min_backlog, self.yield_share,
                                                               self.confirm_drains, self.horizon_s)),
            gate=OwnersRecentlyPressed(self.min_backlog, self.yield_share, self.horizon_s),
            backlog=Backlog(self.min_backlog, self.max_guests_per_tenant), stages=tuple(stages), bind=AddChosen())

    def step(self, now_s: float, state: ClusterView) -> Decision:
        return self.steps.step(now_s, state)


def confirmed_drain(state: ClusterView, guest: ReplicaInfo, why: Figures, horizon_s: float,
                    decision: Decision) -> Figures | None:
    """``why`` (an owner presses) with the what-if's figures (``late_with``, ``late_without``)
    when keeping ``guest`` is predicted to make more of the other tenants' requests late over
    ``horizon_s`` than draining it; ``None`` (keep it) otherwise. Measured live: a standard
    owner's short backlog (4 waiting, 42% of their TTFT allowance left) drained the saturated
    tenant's guest, which the owner's own iterations would have cleared beside it, and the
    saturated tenant then met 43% of its SLA."""
    kept, drained = state.drain_what_if(guest.replica_id, horizon_s)
    decision.num_whatifs += 1
    late_kept, late_drained = sum(kept.violations_by_tenant.values()), sum(drained.violations_by_tenant.values())
    if late_kept <= late_drained:
        return None
    return {**why, "late_with": late_kept, "late_without": late_drained}


def spilled_homes(replicas: Sequence[ReplicaInfo]) -> set[str]:
    """Devices of the homes of models that have a guest (none draining) elsewhere."""
    spilled = {r.model_uid for r in replicas if r.guest and not r.draining}
    return {d for r in replicas if not r.guest and not r.draining and r.model_uid in spilled for d in r.device_ids}


def headroom_models(replicas: Sequence[ReplicaInfo], busy: dict[str, float], threshold: float,
                    exclude: set[str]) -> dict[str, str]:
    """Models (and their families) with no guest, none draining, not in ``exclude``, whose home
    devices are at least ``threshold`` busy (the busiest of them), busiest first. A home that
    hosts another model's guest does not count: its busy time is partly lent, and its owners'
    backlog drains that guest (measured live: acme's guest made globex's home executor half
    busy, and globex got a guest ahead of a backlog on acme's saturated home)."""
    heat: dict[str, float] = {}
    family_of: dict[str, str] = {}
    skip = set(exclude)
    lending = {d for r in replicas if r.guest for d in r.device_ids}  # a model's own guest skips it anyway
    for r in replicas:
        # A model with a guest has its headroom; one draining is moving; a home lending time is not hot.
        if r.guest or r.draining or lending.intersection(r.device_ids):
            skip.add(r.model_uid)
            continue
        heat[r.model_uid] = max(heat.get(r.model_uid, 0.0), *(busy.get(d, 0.0) for d in r.device_ids))
        family_of[r.model_uid] = r.family
    return {m: family_of[m] for m in sorted(heat, key=lambda m: -heat[m]) if heat[m] >= threshold and m not in skip}


def owner_pressure(owner: ReplicaInfo, min_backlog: int, yield_share: float) -> Figures | None:
    """Why ``owner``'s backlog presses, in figures (``owner``, ``waiting``, ``slack_share``: None
    when unknown): at least ``min_backlog`` waiting, and one of them with less than
    ``yield_share`` of its TTFT allowance left (unknown: every backlog presses); ``None`` when it
    does not."""
    if owner.waiting < min_backlog or owner.wait_slack_share >= yield_share:
        return None
    return {"owner": owner.model_uid, "waiting": owner.waiting, "slack_share": share_or_none(owner.wait_slack_share)}


def owner_pressed(owner: ReplicaInfo, min_backlog: int, yield_share: float) -> str | None:
    """:func:`owner_pressure` in words, for a line; ``None`` when the backlog does not press."""
    why = owner_pressure(owner, min_backlog, yield_share)
    return None if why is None else pressed_words(why)


def candidate_groups(state: ClusterView, model_uid: str, k: int,
                     search: Callable[[SlotQuery], list[Slot]] | None = None) -> list[tuple[str, ...]]:
    """Dependency- and memory-safe device groups for a guest replica of ``model_uid``, best first.

    Asks the candidate-slot search (:mod:`service.core.slot`, the same contract the GMG answers in
    Cypher) for devices where one iteration of the model can run: its weight shard is an input
    coming from a home replica's device (so the copy over the link delays the slot), it needs
    the shard plus the KV reserve resident, and the device must be free for an iteration. Slots
    are feasible slots; they are ranked by the device's recent utilisation (in tenths: a device
    idle for a moment between two iterations of a busy tenant is not an idle device), then by
    earliest start, then headroom. The smallest tensor-parallel degree with enough slots on one
    host wins; a group never spans hosts. ``search`` answers the slot queries: the in-memory
    search over ``state.slot_state()`` by default (replay), the Cypher query over the GMG live.
    """
    replicas = list(state.replicas())
    mine = [r for r in replicas if r.model_uid == model_uid and not r.draining]
    family = mine[0].family
    taken = {d for r in mine for d in r.device_ids}
    source = mine[0].device_ids[0]
    weights = state.weight_bytes(family)
    reserve = state.kv_reserve_bytes(family)
    if search is None:
        slots_state = state.slot_state()

        def search(q: SlotQuery) -> list[Slot]:
            return find_slots_in_memory(slots_state, q)
    host_of = {d.device_id: d.host_id for d in state.devices()}
    busy = {d.device_id: round(d.utilisation, 1) for d in state.devices()}
    kinds = {d.kind for d in state.spec.devices}
    for tp in TP_DEGREES:
        shard = math.ceil(weights / tp)
        query = SlotQuery(state.spec.name, mine[0].tenant_id, model_uid, state.now_s,
                          dict.fromkeys(kinds, state.iteration_s(family, tp)), slice_bytes=math.ceil(reserve / tp),
                          weight_bytes=shard, needs_weights=True,
                          input_deps=(InputDep(source, state.now_s, shard),), k=len(host_of))
        slots = sorted((s for s in search(query) if s.device_id not in taken),
                       key=lambda s: (busy[s.device_id], s.start_s, -s.headroom_bytes, s.device_id))
        by_host: dict[str, list[str]] = {}
        groups: list[tuple[str, ...]] = []
        for slot in slots:  # best first
            members = by_host.setdefault(host_of[slot.device_id], [])
            members.append(slot.device_id)
            if len(members) == tp:
                groups.append(tuple(members))
                by_host[host_of[slot.device_id]] = []
        if groups:
            return groups[:k]
    return []


def container_policy() -> PlacementPolicy:
    return ContainerPlacementPolicy()


def replica_policy(*, find_devices: DeviceFinder | None = None, horizon_s: float = 20.0, max_candidates: int = 3,
                   min_backlog: int = 2, idle_drain_s: float = 30.0, max_guests_per_tenant: int = 4,
                   headroom_utilisation: float | None = None, confirm_drains: bool = False) -> PlacementPolicy:
    """The replica policy; ``find_devices`` is the candidate search (default: in memory)."""
    if headroom_utilisation is not None and not 0.0 < headroom_utilisation <= 1.0:
        raise InvalidInputError(f"headroom_utilisation must be in (0, 1], got {headroom_utilisation}")
    return ReplicaPlacementPolicy(horizon_s=horizon_s, max_candidates=max_candidates, min_backlog=min_backlog,
                                  idle_drain_s=idle_drain_s, max_guests_per_tenant=max_guests_per_tenant,
                                  headroom_utilisation=headroom_utilisation, confirm_drains=confirm_drains,
                                  find_devices=find_devices or candidate_groups)
