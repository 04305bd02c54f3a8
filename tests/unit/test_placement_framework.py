# mypy: disable-error-code="arg-type"
"""Placement as filter, score, bind: each step's status says what it came to (placed, or nothing
placed and why), its reasons carry their figures and render to the lines the notes always had,
the parts compose, and the registry builds policies from typed arguments."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest

from service.core.framework import (
    AddChosen,
    Backlog,
    Candidates,
    ChainedFilter,
    GuestDrains,
    NoClosedDevices,
    PlacementStage,
    PlacementSteps,
    StepContext,
    WhatIfBudget,
    WhatIfJudge,
)
from service.core.placement import ContainerPlacementPolicy, OwnerPressed, ReplicaPlacementPolicy
from service.core.policies import PLACEMENT_POLICIES, make_placement_policy
from service.core.reason import STATUS_CODES, DecisionReason, Status
from service.core.scheduler import Decision, DeviceInfo, ReplicaChange, ReplicaInfo, SliceSize, WhatIfOutcome
from service.core.slicing import OwnerMemory
from service.domain.error import InvalidInputError


def outcome(tokens: int, late: dict[str, int], *, memory: int = 0) -> WhatIfOutcome:
    return WhatIfOutcome(20.0, tokens, late, memory, {})


def replica(rid: str, unit: str, waiting: int, *, guest: bool = False, share: float = -math.inf,
            idle_s: float = 0.0, running: int = 0, yields: bool = False) -> ReplicaInfo:
    model = rid.split("@")[0]
    return ReplicaInfo(rid, model.split("/")[0], model, "tiny", (unit,), waiting, running, guest, False, idle_s, share,
                       yields)


class View:
    """A cluster view with canned answers: what-ifs per target unit (None: it does not fit),
    drain what-ifs per guest, free bytes per unit and one KV reserve for every family."""

    def __init__(self, replicas: list[ReplicaInfo], answers: dict[str, tuple[WhatIfOutcome, WhatIfOutcome | None]]
                 | None = None, *, drains: dict[str, tuple[WhatIfOutcome, WhatIfOutcome]] | None = None,
                 free_bytes: dict[str, int] | None = None, kv_reserve_bytes: int = 0) -> None:
        self._replicas = replicas
        self.answers = answers or {}
        self.drains = drains or {}
        self.free = free_bytes or {}
        self.reserve = kv_reserve_bytes
        self.asked: list[ReplicaChange] = []

    def replicas(self) -> list[ReplicaInfo]:
        return self._replicas

    def devices(self) -> list[DeviceInfo]:
        units = sorted({d for r in self._replicas for d in r.device_ids} | set(self.free))
        return [DeviceInfo(u, u, self.free.get(u, 0), 0.0, ()) for u in units]

    def kv_reserve_bytes(self, family: str) -> int:
        return self.reserve

    def slice_sizes(self, family: str, layers_per_slice: int) -> list[SliceSize]:
        return [SliceSize(i, i + layers_per_slice - 1, 1, 1) for i in range(0, 2, layers_per_slice)]

    def iteration_s(self, family: str, tp: int) -> float:
        return 0.01

    def what_if(self, change: ReplicaChange, horizon_s: float, *, drain_s: float = 0.0
                ) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        self.asked.append(change)
        return self.answers[change.device_ids[0]]

    def drain_what_if(self, replica_id: str, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome]:
        return self.drains[replica_id]


def policy(*units: str, **params: object) -> ReplicaPlacementPolicy:
    """The replica policy whose candidate search answers ``units``, one unit per group."""
    return ReplicaPlacementPolicy(find_devices=lambda state, model, k: [(u,) for u in units], **params)


HOME = replica("acme/m@ea", "ea", 6, share=0.1)  # acme has a backlog that wants room
CALM = replica("initech/m@eb", "eb", 0, share=math.inf)
BASE = outcome(1000, {"acme/m": 4, "initech/m": 0})


# ---- status: nothing placed, and why --------------------------------------------------------------
def test_a_step_with_no_backlog_says_no_backlog_and_judges_nothing() -> None:
    view = View([replica("acme/m@ea", "ea", 1), CALM])
    decision = policy("eb").step(0.0, view)
    assert decision.status == Status("no_backlog") and decision.add == [] and view.asked == []
    assert decision.num_whatifs == 0


def test_a_backlog_with_no_candidate_slot_says_no_candidates_naming_the_models() -> None:
    decision = policy().step(0.0, View([HOME, CALM]))
    assert decision.status is not None and decision.status.code == "no_candidates"
    assert decision.status.figures["models"] == ["acme/m"]


def test_a_step_whose_only_candidate_makes_a_tenant_worse_says_tenant_worse_with_the_tenant() -> None:
    worse = outcome(1500, {"acme/m": 0, "initech/m": 3})  # acme spared, initech's requests made late
    decision = policy("eb").step(0.0, View([HOME, CALM], {"eb": (BASE, worse)}))
    assert decision.add == [] and decision.num_whatifs == 1
    # The tenant as the what-if counts it (a tenant in replay, its model's uid live, as here).
    assert decision.status == Status("tenant_worse", "initech/m", {"judged": 1, "verdicts": {"tenant_worse": 1},
                                                                    "late_delta": 3})
    assert decision.status.text() == "nothing placed: no safe candidate; initech/m would have 3 more requests late"


def test_a_candidate_that_does_not_fit_or_risks_memory_says_no_fit_memory() -> None:
    risky = outcome(1500, {"acme/m": 0}, memory=1)
    decision = policy("eb", "ec").step(0.0, View([HOME, CALM], {"eb": (BASE, None), "ec": (BASE, risky)}))
    assert decision.status is not None and decision.status.code == "no_fit_memory"
    assert decision.status.figures["verdicts"] == {"no_fit": 1, "memory": 1}


def test_safe_candidates_that_do_no_good_say_no_gain_even_beside_an_unsafe_one() -> None:
    same = outcome(900, {"acme/m": 4, "initech/m": 0})
    worse = outcome(2000, {"acme/m": 0, "initech/m": 1})
    decision = policy("eb", "ec").step(0.0, View([HOME, CALM], {"eb": (BASE, worse), "ec": (BASE, same)}))
    assert decision.status is not None and decision.status.code == "no_gain" and decision.status.figures["safe"] == 1


def test_a_step_that_places_says_placed_with_a_reason_carrying_the_figures() -> None:
    better = outcome(1100, {"acme/m": 1, "initech/m": 0})
    decision = policy("eb").step(0.0, View([HOME, CALM], {"eb": (BASE, better)}))
    assert decision.status is not None and decision.status.placed
    [reason] = decision.reasons
    assert (reason.code, reason.tenant, reason.model, reason.devices) == ("add", "acme", "acme/m", ("eb",))
    assert {k: reason.figures[k] for k in ("tokens_gain", "horizon_s", "late_before", "late_after")} == {
        "tokens_gain": 100, "horizon_s": 20.0, "late_before": 4, "late_after": 1}
    assert decision.notes == ("add acme/m on eb: +100 tokens in 20s, 3 fewer requests late (4 -> 1), "
                              "late with what follows the horizon 4 -> 1, no tenant worse, no memory at risk",)
    shown = reason.as_dict()
    assert shown["text"] == decision.notes[0] and shown["figures"]["tokens_gain"] == 100


def test_a_step_whose_what_if_time_runs_out_says_whatif_budget_spent_and_why() -> None:
    ticks = itertools.count()  # each reading of the clock is one second later
    same = outcome(900, {"acme/m": 4})
    steps = PlacementSteps("capped", drains=GuestDrains(30.0, OwnerMemory()), gate=NoClosedDevices(),
                           backlog=Backlog(), stages=(PlacementStage(Units("eb", "ec", "ed"), WhatIfJudge(20.0)),),
                           budget=WhatIfBudget(1.5, lambda: float(next(ticks))))
    decision = steps.step(0.0, View([HOME], {u: (BASE, same) for u in ("eb", "ec", "ed")}))
    assert decision.status is not None and decision.status.code == "whatif_budget_spent"
    assert decision.whatifs_skipped == decision.status.figures["skipped"] > 0
    assert [r.code for r in decision.reasons] == ["whatifs_unjudged"]
    assert decision.notes[-1].endswith("plans left unjudged: the step's 1.5 s of what-ifs ran out")


def test_the_container_policy_says_its_placement_is_static() -> None:
    assert ContainerPlacementPolicy().step(0.0, View([HOME])).status == Status("static")
    assert set(STATUS_CODES) >= {"no_backlog", "no_candidates", "no_fit_memory", "tenant_worse", "no_gain",
                                 "whatif_budget_spent"}


# ---- drain reasons ---------------------------------------------------------------------------------
def test_drain_reasons_carry_their_figures_and_render_the_old_lines() -> None:
    idle = replica("acme/m@g1", "eb", 0, guest=True, idle_s=42.4)
    decision = policy().step(0.0, View([replica("acme/m@ea", "ea", 0), idle, CALM]))
    assert decision.reasons == [DecisionReason("drain_idle", "acme/m", "acme", ("eb",), "acme/m@g1", {"idle_s": 42.4})]
    assert decision.notes == ("drain acme/m@g1: idle 42s",)
    guest = replica("acme/m@g1", "eb", 3, guest=True)
    owner = replica("globex/m@eb", "eb", 4, share=0.42)
    harmful = View([replica("acme/m@ea", "ea", 0), guest, owner],
                   drains={"acme/m@g1": (outcome(900, {"globex/m": 5}), outcome(800, {"globex/m": 1}))})
    [reason] = policy(confirm_drains=True).step(0.0, harmful).reasons
    assert reason.code == "drain_owner_pressed" and reason.figures == {
        "owner": "globex/m", "waiting": 4, "slack_share": 0.42, "late_with": 5, "late_without": 1}
    assert reason.text() == ("drain acme/m@g1: owner globex/m has 4 waiting, one with 42% of its TTFT allowance "
                             "left; the others' requests predicted late 5 with it, 1 without")


def test_a_yielding_guest_leaves_for_an_owner_whose_device_lacks_its_kv_reserve() -> None:
    guest = replica("acme/m@g1", "eb", 3, guest=True, yields=True)
    owner = replica("globex/m@eb", "eb", 4, share=0.9)
    slice_policy = make_placement_policy("slice", find_devices=lambda state, model, k: [],
                                         find_plans=lambda state, model, q, k: [])
    decision = slice_policy.step(0.0, View([replica("acme/m@ea", "ea", 0), guest, owner], free_bytes={"eb": 10},
                                           kv_reserve_bytes=64))
    [reason] = decision.reasons
    assert reason.code == "drain_owner_memory" and reason.figures == {
        "owner": "globex/m", "waiting": 4, "device": "eb", "free_bytes": 10, "kv_reserve_bytes": 64}
    assert decision.notes == ("drain acme/m@g1: owner globex/m has 4 waiting and eb lacks its KV reserve",)


# ---- composition --------------------------------------------------------------------------------
class Units:
    """A filter answering one whole guest per unit for each model wanting room."""

    def __init__(self, *units: str) -> None:
        self.units = units

    def candidates(self, ctx: StepContext) -> Candidates:
        def changes() -> Iterator[ReplicaChange]:
            for model in ctx.pressing:
                for u in self.units:
                    yield ReplicaChange(model, ctx.family_of[model], (u,))
        return Candidates(changes(), tuple(ctx.pressing))


def test_steps_compose_a_filter_chain_a_judge_and_a_bind_and_the_first_stage_that_places_wins() -> None:
    same = outcome(900, {"acme/m": 4})
    better = outcome(1100, {"acme/m": 2})
    view = View([HOME, CALM], {"eb": (BASE, same), "ec": (BASE, better), "ed": (BASE, better)})
    steps = PlacementSteps("composed", drains=GuestDrains(30.0, OwnerPressed()), gate=NoClosedDevices(),
                           backlog=Backlog(),
                           stages=(PlacementStage(ChainedFilter((Units("eb"), Units("ec"))), WhatIfJudge(20.0)),
                                   PlacementStage(Units("ed"), WhatIfJudge(20.0, ahead=True))),
                           bind=AddChosen(mode_in_words=True))
    decision = steps.step(0.0, view)
    assert [c.device_ids for c in view.asked] == [("eb",), ("ec",)]  # the second stage never ran
    assert [c.device_ids for c in decision.add] == [("ec",)]
    assert decision.notes[0].startswith("add acme/m on ec (whole, turns): +100 tokens in 20s")
    # Nothing good in the first stage: the second one (a guest ahead of a backlog) places.
    view = View([HOME, CALM], {"eb": (BASE, same), "ec": (BASE, same), "ed": (BASE, same)})
    decision = steps.step(0.0, view)
    assert [c.device_ids for c in decision.add] == [("ed",)] and decision.status is not None
    assert decision.status.placed and decision.reasons[0].figures["ahead"] is True


def test_a_first_stage_with_nothing_to_judge_takes_a_later_stages_status() -> None:
    worse = outcome(1100, {"acme/m": 4, "initech/m": 2})
    steps = PlacementSteps("two", drains=GuestDrains(30.0, OwnerPressed()), gate=NoClosedDevices(), backlog=Backlog(),
                           stages=(PlacementStage(Units(), WhatIfJudge(20.0)),
                                   PlacementStage(Units("ed"), WhatIfJudge(20.0, ahead=True))))
    decision = steps.step(0.0, View([HOME, CALM], {"ed": (BASE, worse)}))
    assert decision.status is not None and (decision.status.code, decision.status.tenant) == ("tenant_worse", "initech/m")


def test_the_three_guest_policies_are_built_of_the_same_steps() -> None:
    for name in ("replica", "slice", "slice-fixed"):
        built = make_placement_policy(name)
        steps = built.steps  # type: ignore[attr-defined]
        assert isinstance(steps, PlacementSteps) and steps.name == name
        assert all(isinstance(s.judge, WhatIfJudge) for s in steps.stages)


# ---- the registry --------------------------------------------------------------------------------
def test_the_registry_builds_from_typed_arguments_and_refuses_the_wrong_ones() -> None:
    assert set(PLACEMENT_POLICIES) == {"container", "replica", "slice", "slice-fixed"}
    built = make_placement_policy("replica", horizon_s=5, find_devices=lambda state, model, k: [])
    assert isinstance(built, ReplicaPlacementPolicy) and built.horizon_s == 5
    for name, params, says in (("replica", {"horizon_s": "20"}, "horizon_s must be float"),
                               ("replica", {"confirm_drains": 1}, "confirm_drains must be bool"),
                               ("replica", {"max_candidates": 2.5}, "max_candidates must be int"),
                               ("slice", {"whatif_wall_s": "1"}, "whatif_wall_s must be float or NoneType"),
                               ("container", {"horizon_s": 1.0}, "takes no parameter 'horizon_s'"),
                               ("slice-fixed", {"find_devices_typo": 1}, "takes no parameter")):
        with pytest.raises(InvalidInputError, match=says):
            make_placement_policy(name, **params)
    # The device search goes only to the policies registered as taking it (no name special case).
    assert make_placement_policy("slice-fixed", find_devices=lambda state, model, k: []).name == "slice-fixed"
    assert isinstance(make_placement_policy("container", find_devices=lambda s, m, k: []), ContainerPlacementPolicy)


def test_a_decision_s_notes_are_its_reasons_rendered_and_cannot_drift_from_them() -> None:
    decision = Decision()
    decision.reasons.append(DecisionReason("drain_idle", replica="a/m@g", figures={"idle_s": 31.0}))
    assert decision.notes == ("drain a/m@g: idle 31s",)
    with pytest.raises(AttributeError):
        decision.notes.append("free text")  # type: ignore[attr-defined]
