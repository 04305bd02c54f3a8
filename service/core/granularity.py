"""The ``slice`` placement policy: one placement over every granularity.

At every step, for each model with a backlog, the policy judges with the what-if simulator
plans at every granularity it can place, and commits the one that does most good over the
horizon (:func:`~service.core.placement.best_by_what_if`: sustained lateness first, then output
tokens, no tenant predicted worse, no memory violation; see
:func:`~service.core.placement.sustained_then_tokens`):

- the whole model as a guest replica (tensor parallel on one host where it needs several
  devices), taking turns with the owners iteration by iteration: exactly the guest replicas
  the ``replica`` policy judges, under its rules (no
  guest where an owner pressed within the horizon, nor on the home of a model that has a guest
  elsewhere; :class:`~service.core.placement.ReplicaPlacementPolicy`);
- the model cut into slices of consecutive layers, from one slice (the whole model on one
  device) through a quarter of its layers to the fixed quantum of ``slice-fixed`` (the most
  layers whose share of a typical iteration fits ``slice_budget_s``), each slice kept on the
  previous slice's device while its memory lasts (:func:`~service.core.slicing.plans_at_quantum`),
  so a model no single device holds (the 70B case) spreads its layers over the free memory of
  several; each plan under owner priority (its slices yield to the devices' owners at slice
  boundaries) and, where it spans several devices none of which is closed to guests, also
  taking turns with them (a whole model on one device taking turns is a guest replica, judged
  above).

The guest replicas come first and a later plan must score strictly better to be chosen, so on
the policy's score the step never picks below the best guest replica it judged. The score is
sustained lateness spared (the late requests within the horizon plus those in flight at its
end that end late when the what-if runs on for ``lateness_drain_s`` without arrivals), then
tokens: ``replica``'s score (late requests within the horizon, then tokens) ranked a guest that
admits less and decodes faster above a sliced plan that spares as many late requests and
leaves a shorter queue (:func:`~service.core.placement.sustained_then_tokens`).

Wall time: ``max_candidates`` and ``max_slice_plans`` cap a step's what-ifs by count;
``whatif_wall_s`` (off by default) caps them by wall seconds as well. The guest replicas are
judged first, so a cap cuts sliced plans before them; a capped replay depends on the machine's
speed and is not reproducible, which is why replay leaves it off.

Drains: a guest that takes turns leaves under ``replica``'s rules (idle ``idle_drain_s``, or an
owner of one of its devices whose backlog presses); a guest that yields to owners leaves when
idle, or when an owner of one of its devices has a backlog and the device lacks the memory
for the owner's KV reserve (``slice-fixed``'s rule: owner priority already keeps the owner's
iterations first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from service.core.framework import (
    AddChosen,
    Backlog,
    Candidates,
    ChainedFilter,
    DrainRule,
    GuestDrains,
    OwnerRule,
    PlacementStage,
    PlacementSteps,
    StepContext,
    WhatIfBudget,
    WhatIfJudge,
    WhatIfScore,
    describe,
    sustained_then_tokens,
)
from service.core.placement import DeviceFinder, GuestReplicas, OwnerPressed, OwnersRecentlyPressed, candidate_groups
from service.core.scheduler import ClusterView, Decision, ReplicaChange
from service.core.slicing import OwnerMemory, Stage, plans_at_quantum, quantum
from service.domain.error import InvalidInputError

__all__ = ["GranularPlacementPolicy", "QuantumPlanFinder", "describe", "granular_policy", "quanta"]

QuantumPlanFinder = Callable[[ClusterView, str, int, int], list[tuple[Stage, ...]]]
"""``(state, model_uid, layers_per_slice, k) -> plans, best first``: where a model's slices may go."""


def quanta(num_layers: int, fixed: int) -> list[int]:
    """Layers per slice to try, coarsest first: the whole model, the largest divisor of
    ``num_layers`` within a quarter of it, and ``fixed`` (each once)."""
    quarter = max((q for q in range(1, num_layers // 4 + 1) if num_layers % q == 0), default=1)
    return list(dict.fromkeys((num_layers, quarter, fixed)))


@dataclass(frozen=True, slots=True)
class GranularPlans:
    """Filter: up to ``max_slice_plans`` sliced plans per model wanting room, coarsest quantum
    first (:func:`quanta`), each under owner priority and (several devices, none closed) under
    turns; ``find_plans`` answers a quantum's plans (:func:`plans_at_quantum` by default)."""

    find_plans: QuantumPlanFinder
    max_slice_plans: int = 4
    slice_budget_s: float = 0.02

    def candidates(self, ctx: StepContext) -> Candidates:
        state, family_of, closed = ctx.state, ctx.family_of, ctx.closed
        return Candidates((c for model in ctx.pressing for c in self.changes(state, model, family_of[model], closed)),
                          tuple(ctx.pressing))

    def changes(self, state: ClusterView, model_uid: str, family: str, closed: set[str]) -> Iterator[ReplicaChange]:
        num_layers = len(state.slice_sizes(family, 1))
        fixed = quantum(state.iteration_s(family, 1), num_layers, self.slice_budget_s)
        seen: set[tuple[Stage, ...]] = set()
        made = 0
        for q in quanta(num_layers, fixed):
            for plan in self.find_plans(state, model_uid, q, 1):
                if plan in seen:
                    continue
                seen.add(plan)
                devices = tuple(dict.fromkeys(d for d, _, _ in plan))
                modes = [False] + ([True] if len(devices) > 1 and not closed.intersection(devices) else [])
                for turns in modes:
                    if made >= self.max_slice_plans:
                        return
                    made += 1
                    yield ReplicaChange(model_uid, family, devices, plan, turns=turns)


@dataclass(frozen=True, slots=True)
class ByGuestMode:
    """Drain rule: a guest that takes turns leaves under ``turns`` (``replica``'s
    :class:`OwnerPressed`), one that yields to owners under ``yields`` (``slice-fixed``'s
    :class:`OwnerMemory`)."""

    turns: DrainRule
    yields: DrainRule

    def for_step(self, ctx: StepContext) -> OwnerRule:
        yields, turns = self.yields.for_step(ctx), self.turns.for_step(ctx)
        return lambda guest, owner, device: (yields if guest.yields_to_owners else turns)(guest, owner, device)


@dataclass
class GranularPlacementPolicy:
    """Plans at every granularity for each backlogged model, judged by the what-if (module
    doc): ``replica``'s :class:`GuestReplicas` then :class:`GranularPlans`, judged by one
    :class:`WhatIfJudge`, guests released by :class:`ByGuestMode`, devices closed by
    ``replica``'s :class:`OwnersRecentlyPressed`. ``find_devices`` answers the whole replicas'
    device groups (:func:`candidate_groups` by default), ``find_plans`` the sliced plans at a
    quantum (:func:`plans_at_quantum`). The fields are read once, when the policy is built."""

    horizon_s: float = 20.0  # what-if look-ahead
    max_candidates: int = 3  # whole guest replicas judged per backlogged model and step (as ``replica``)
    max_slice_plans: int = 4  # sliced plans judged per backlogged model and step
    min_backlog: int = 2  # waiting requests before a model looks for more room
    idle_drain_s: float = 30.0  # a guest idle this long is drained
    max_guests_per_tenant: int = 4  # guests (whole or sliced) per served model
    yield_share: float = 0.5  # an owner presses once a waiting request has this share of its TTFT allowance left
    slice_budget_s: float = 0.02  # the finest quantum: a slice's typical run time stays within this
    # Wall seconds of what-ifs per step (None: no cap), read from ``clock`` (the caller's wall
    # clock: core reads none itself). Off by default: with a cap, which plans a step judges
    # depends on the machine's speed and load, and a replay is no longer reproducible.
    whatif_wall_s: float | None = None
    clock: Callable[[], float] | None = None
    score: WhatIfScore = field(default_factory=lambda: sustained_then_tokens)  # how a plan's good is ranked
    # How long each what-if runs on after the horizon, without arrivals, to count the requests it
    # leaves behind that end late (0: none, and the score sees only the horizon). Twice the
    # horizon: what a step leaves queued has that long to clear before it counts as late.
    lateness_drain_s: float = 40.0
    find_devices: DeviceFinder = field(default_factory=lambda: candidate_groups)
    find_plans: QuantumPlanFinder = field(default_factory=lambda: plans_at_quantum)
    name: str = "slice"
    steps: PlacementSteps = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.lateness_drain_s >= 0.0:
            raise InvalidInputError(f"lateness_drain_s must be at least 0 seconds, got {self.lateness_drain_s}")
        if self.whatif_wall_s is not None and (self.clock is None or not self.whatif_wall_s > 0.0):
            raise InvalidInputError(f"whatif_wall_s ({self.whatif_wall_s}) needs a clock and a cap above 0 seconds")
        self._plans = GranularPlans(self.find_plans, self.max_slice_plans, self.slice_budget_s)
        candidates = ChainedFilter((GuestReplicas(self.find_devices, self.max_candidates), self._plans))
        self.steps = PlacementSteps(
            self.name,
            drains=GuestDrains(self.idle_drain_s, ByGuestMode(turns=OwnerPressed(self.min_backlog, self.yield_share),
                                                              yields=OwnerMemory(self.min_backlog))),
            gate=OwnersRecentlyPressed(self.min_backlog, self.yield_share, self.horizon_s),
            backlog=Backlog(self.min_backlog, self.max_guests_per_tenant),
            stages=(PlacementStage(candidates, WhatIfJudge(self.horizon_s, self.score, drain_s=self.lateness_drain_s)),),
            bind=AddChosen(mode_in_words=True),
            budget=None if self.whatif_wall_s is None or self.clock is None else WhatIfBudget(self.whatif_wall_s,
                                                                                              self.clock))

    def step(self, now_s: float, state: ClusterView) -> Decision:
        return self.steps.step(now_s, state)

    def sliced_changes(self, state: ClusterView, model_uid: str, family: str, closed: set[str]
                       ) -> Iterator[ReplicaChange]:
        """Up to ``max_slice_plans`` sliced plans for ``model_uid`` (:class:`GranularPlans`)."""
        return self._plans.changes(state, model_uid, family, closed)


def granular_policy(*, find_devices: DeviceFinder | None = None, horizon_s: float = 20.0, max_candidates: int = 3,
                    max_slice_plans: int = 4, min_backlog: int = 2, idle_drain_s: float = 30.0,
                    max_guests_per_tenant: int = 4, yield_share: float = 0.5,
                    slice_budget_s: float = 0.02, lateness_drain_s: float = 40.0,
                    whatif_wall_s: float | None = None, clock: Callable[[], float] | None = None,
                    find_plans: QuantumPlanFinder | None = None) -> GranularPlacementPolicy:
    """The ``slice`` policy; ``find_devices`` is the whole replicas' device search and
    ``find_plans`` the sliced plans' (default: both in memory; live: the Cypher slot search);
    ``whatif_wall_s`` caps a step's what-ifs in wall seconds read from ``clock``
    (default none: a cap makes a replay depend on the machine's speed); a cap without a clock,
    or not above 0, is ``InvalidInputError``."""
    return GranularPlacementPolicy(horizon_s=horizon_s, max_candidates=max_candidates,
                                   max_slice_plans=max_slice_plans, min_backlog=min_backlog,
                                   idle_drain_s=idle_drain_s, max_guests_per_tenant=max_guests_per_tenant,
                                   yield_share=yield_share, slice_budget_s=slice_budget_s,
                                   lateness_drain_s=lateness_drain_s, whatif_wall_s=whatif_wall_s, clock=clock,
                                   find_devices=find_devices or candidate_groups,
                                   find_plans=find_plans or plans_at_quantum)
