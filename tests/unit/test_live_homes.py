"""Container homes of the live service over compute units, and the replica policy's choices
with a saturated tenant next to an idle one: SLAs first, guests yielding to pressing owners."""

from __future__ import annotations

import math

from service.core.placement import ReplicaPlacementPolicy, best_by_what_if, owner_pressed
from service.core.scheduler import Decision, DeviceInfo, ReplicaChange, ReplicaInfo, WhatIfOutcome
from service.live.homes import unit_homes

MiB = 2**20
TWO_BY_TWO = [("ea/cpu:0", "ea", "cpu", 512 * MiB), ("ea/cpu:1", "ea", "cpu", 512 * MiB),
              ("eb/cpu:0", "eb", "cpu", 512 * MiB), ("eb/cpu:1", "eb", "cpu", 512 * MiB)]


def executors(homes: list[tuple[str, tuple[str, ...]]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for uid, devices in homes:
        out.setdefault(uid, []).extend(sorted({d.split("/")[0] for d in devices}))
    return out


def test_a_model_gets_one_home_per_executor_and_extras_share_the_least_loaded_one() -> None:
    models = [("acme/m", "small-llama", 100 * MiB, 1.2), ("globex/m", "tiny-llama", 10 * MiB, 0.2),
              ("initech/m", "tiny", 5 * MiB, 0.24)]
    homes = unit_homes(models, TWO_BY_TWO)
    # The busy tenant's unit is its own; the two light ones share the other, each on its own device.
    assert executors(homes) == {"acme/m": ["ea"], "globex/m": ["eb"], "initech/m": ["eb"]}
    light = {uid: devices for uid, devices in homes if uid != "acme/m"}
    assert len(set(light.values())) == 2 and all(len(ds) == 1 for ds in light.values())
    # One model alone: one replica per executor, never two on one (they would split its batches).
    alone = unit_homes([("acme/m", "small-llama", 100 * MiB, 1.0)], TWO_BY_TWO)
    assert executors(alone) == {"acme/m": ["ea", "eb"]} and len(alone) == 2


def test_weights_no_single_device_holds_span_the_executors_devices() -> None:
    homes = unit_homes([("big/m", "small-llama", 700 * MiB, 1.0)], TWO_BY_TWO)
    assert sorted(homes) == [("big/m", ("ea/cpu:0", "ea/cpu:1")), ("big/m", ("eb/cpu:0", "eb/cpu:1"))]


class CannedView:
    """What ``best_by_what_if`` asks of a view: canned what-if answers per target unit."""

    def __init__(self, answers: dict[str, tuple[WhatIfOutcome, WhatIfOutcome | None]]) -> None:
        self.answers = answers

    def what_if(self, change: ReplicaChange, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        return self.answers[change.device_ids[0]]


def outcome(tokens: int, late: dict[str, int]) -> WhatIfOutcome:
    return WhatIfOutcome(20.0, tokens, late, 0, {})


def test_fewer_late_requests_win_over_more_tokens_and_no_tenant_may_get_worse() -> None:
    base = outcome(2000, {"acme/m": 10})
    view = CannedView({
        "eb": (base, outcome(1800, {"acme/m": 4})),  # the idle tenant serves a burst later: fewer tokens now
        "ec": (base, outcome(2600, {"acme/m": 10})),  # more tokens, as many late
        "ed": (base, outcome(3000, {"acme/m": 0, "globex/m": 1})),  # another tenant worse: never
    })
    changes = [ReplicaChange("acme/m", "small-llama", (u,)) for u in ("ec", "ed", "eb")]
    decision = Decision()
    best = best_by_what_if(view, changes, 20.0, decision)  # type: ignore[arg-type]
    assert best is not None and best[1].device_ids == ("eb",) and best[0] == -200
    assert decision.num_whatifs == 3
    # With no change sparing a late request, tokens decide; with neither, nothing is chosen.
    best = best_by_what_if(view, changes[:1], 20.0, Decision())  # type: ignore[arg-type]
    assert best is not None and best[1].device_ids == ("ec",)
    flat = CannedView({"eb": (base, outcome(1900, {"acme/m": 10}))})
    assert best_by_what_if(flat, changes[2:], 20.0, Decision()) is None  # type: ignore[arg-type]


def replica(rid: str, unit: str, waiting: int, *, guest: bool = False, share: float = -math.inf) -> ReplicaInfo:
    model = rid.split("@")[0]
    return ReplicaInfo(rid, model.split("/")[0], model, "tiny", (unit,), waiting, 0, guest, False, 0.0, share)


def test_an_owner_presses_only_once_its_backlog_nears_its_ttft_target() -> None:
    assert owner_pressed(replica("b/m@eb", "eb", 5, share=0.9), 2, 0.5) is None  # a batch backlog, fresh
    assert "10% of its TTFT allowance" in (owner_pressed(replica("b/m@eb", "eb", 5, share=0.1), 2, 0.5) or "")
    assert owner_pressed(replica("b/m@eb", "eb", 1, share=-1.0), 2, 0.5) is None  # below the backlog floor
    assert owner_pressed(replica("b/m@eb", "eb", 2), 2, 0.5) == "owner b/m has 2 waiting"  # unknown: presses


class UnitsView(CannedView):
    def __init__(self, replicas: list[ReplicaInfo], answers: dict[str, tuple[WhatIfOutcome, WhatIfOutcome | None]]
                 ) -> None:
        super().__init__(answers)
        self._replicas = replicas

    def replicas(self) -> list[ReplicaInfo]:
        return self._replicas

    def devices(self) -> list[DeviceInfo]:
        return []


def test_a_guest_stays_through_a_fresh_batch_backlog_and_never_goes_where_an_owner_presses() -> None:
    base = outcome(1000, {"acme/m": 8})
    better = outcome(900, {"acme/m": 2})
    home = replica("acme/m@ea", "ea", 12, share=0.2)
    guest = replica("acme/m@g1", "eb", 0, guest=True)
    patient = replica("initech/m@eb", "eb", 16, share=0.8)  # a batch tenant's burst, long TTFT allowance left
    policy = ReplicaPlacementPolicy(find_devices=lambda state, model, k: [("eb",), ("ea",)])
    decision = policy.step(0.0, UnitsView([home, guest, patient], {"eb": (base, better), "ea": (base, better)}))
    assert decision.drain == []
    urgent = replica("initech/m@eb", "eb", 16, share=0.3)
    decision = policy.step(0.0, UnitsView([home, guest, urgent], {"eb": (base, better), "ea": (base, better)}))
    assert decision.drain == ["acme/m@g1"] and "30% of its TTFT allowance" in decision.notes[0]
    # initech presses on eb: no guest of acme may go there; ea is acme's own and taken by find_devices' caller.
    assert all(c.device_ids != ("eb",) for c in decision.add)
    assert all(run.change.device_ids != ("eb",) for run in decision.whatifs)


def test_a_unit_whose_owner_pressed_within_the_horizon_takes_no_guest() -> None:
    base = outcome(1000, {"initech/m": 0})
    more = outcome(1500, {"initech/m": 0})  # a batch tenant's guest: more tokens, nobody late either way
    policy = ReplicaPlacementPolicy(find_devices=lambda state, model, k: [("ea",)], horizon_s=20.0)
    acme_pressing = replica("acme/m@ea", "ea", 6, share=0.1)
    acme_calm = replica("acme/m@ea", "ea", 0, share=math.inf)
    initech = replica("initech/m@eb", "eb", 9, share=0.9)
    assert policy.step(100.0, UnitsView([acme_pressing, initech], {"ea": (base, more)})).add == []
    # Five seconds later acme's backlog is gone: its unit still takes no guest (it pressed within 20 s) ...
    assert policy.step(105.0, UnitsView([acme_calm, initech], {"ea": (base, more)})).add == []
    # ... until the horizon has passed without a press.
    later = policy.step(121.0, UnitsView([acme_calm, initech], {"ea": (base, more)}))
    assert [c.device_ids for c in later.add] == [("ea",)]
    # A clock that restarted (a new run on the same policy) forgets the old presses.
    policy.step(100.0, UnitsView([acme_pressing, initech], {"ea": (base, more)}))
    assert [c.device_ids for c in policy.step(1.0, UnitsView([acme_calm, initech], {"ea": (base, more)})).add] == [("ea",)]


def test_no_guest_goes_onto_the_home_of_a_model_with_a_guest_elsewhere() -> None:
    """acme has spilled onto eb (its guest there); initech, at home on eb, then queues. Its guest
    may not go onto ea, acme's home: that would only swap time between the two homes (measured
    live: acme met 89% of its SLA with globex's and initech's guests on its home)."""
    base = outcome(1000, {"initech/m": 6})
    better = outcome(1400, {"initech/m": 1})  # the what-if's turns see only good in it
    policy = ReplicaPlacementPolicy(find_devices=lambda state, model, k: [("ea",), ("ec",)])
    acme = replica("acme/m@ea", "ea", 0, share=math.inf)
    initech = replica("initech/m@eb", "eb", 9, share=0.9)
    answers = {"ea": (base, better), "ec": (base, outcome(1200, {"initech/m": 3}))}
    alone = policy.step(0.0, UnitsView([acme, initech], answers))
    assert [c.device_ids for c in alone.add] == [("ea",)]  # acme has no guest: its home may lend time
    spilled = policy.step(0.0, UnitsView([acme, initech, replica("acme/m@g1", "eb", 0, guest=True)], answers))
    assert [c.device_ids for c in spilled.add] == [("ec",)]
    assert all(run.change.device_ids != ("ea",) for run in spilled.whatifs)
    # A guest on its way out (draining) no longer closes its model's home.
    leaving = ReplicaInfo("acme/m@g1", "acme", "acme/m", "tiny", ("eb",), 0, 0, True, True, 0.0, math.inf)
    assert [c.device_ids for c in policy.step(0.0, UnitsView([acme, initech, leaving], answers)).add] == [("ea",)]


class DrainView(UnitsView):
    """Canned drain what-ifs too: guest id -> (kept, drained)."""

    def __init__(self, replicas: list[ReplicaInfo], drains: dict[str, tuple[WhatIfOutcome, WhatIfOutcome]]) -> None:
        super().__init__(replicas, {})
        self.drains = drains
        self.asked: list[str] = []

    def drain_what_if(self, replica_id: str, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome]:
        self.asked.append(replica_id)
        return self.drains[replica_id]


def test_with_confirmed_drains_a_pressing_owner_drains_a_guest_only_if_it_is_predicted_to_make_others_late() -> None:
    home = replica("acme/m@ea", "ea", 12, share=0.2)
    guest = replica("acme/m@g1", "eb", 3, guest=True)
    globex = replica("globex/m@eb", "eb", 4, share=0.42)  # presses: 4 waiting, 42% of their allowance left
    initech = replica("initech/m@eb", "eb", 3, share=0.3)  # presses too: one drain what-if for the guest
    policy = ReplicaPlacementPolicy(find_devices=lambda state, model, k: [], confirm_drains=True)
    harmless = DrainView([home, guest, globex, initech],
                         {"acme/m@g1": (outcome(900, {"globex/m": 0}), outcome(800, {"globex/m": 0}))})
    decision = policy.step(0.0, harmless)
    assert decision.drain == [] and harmless.asked == ["acme/m@g1"] and decision.num_whatifs == 1
    harmful = DrainView([home, guest, globex, initech],
                        {"acme/m@g1": (outcome(900, {"globex/m": 5}), outcome(800, {"globex/m": 1}))})
    decision = policy.step(0.0, harmful)
    assert decision.drain == ["acme/m@g1"]
    assert "owner globex/m has 4 waiting" in decision.notes[0] and "late 5 with it, 1 without" in decision.notes[0]
    # Without confirmation (replay's default) the press alone drains, asking nothing.
    plain = DrainView([home, guest, globex], {})
    assert ReplicaPlacementPolicy(find_devices=lambda state, model, k: []).step(0.0, plain).drain == ["acme/m@g1"]
    assert plain.asked == []
