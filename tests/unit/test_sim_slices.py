"""Operator-level slices in the simulator: a sliced replica runs each iteration as slices of
layers on other tenants' devices. Properties over random workloads, cuts and sharing modes: no
slice starts before its input has arrived, no device runs two pieces of work at once or exceeds
its memory, under owner priority an owner is never delayed by more than one guest slice, and the
sliced guest never holds more than one request it cannot start; and bad plans are refused with
nothing allocated."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from learned.roofline import RooflineCostModel
from service.cluster.spec import load_cluster_spec
from service.core.scheduler import Decision, ReplicaChange, Scheduler
from service.core.slicing import quantum, slice_plans
from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.engine import IterationFinished, StageFinished, StepRequested
from service.sim.iteration import layers_weight_bytes, slice_sizes, weight_bytes
from service.sim.replica import SliceStage
from service.sim.view import SimClusterView

A100 = load_cluster_spec("8xA100-nvlink")
GUEST = "busy/s1"


class Spans:
    """Every slice or iteration the simulator reports, per device: (start, end, owner)."""

    def __init__(self) -> None:
        self.by_device: dict[str, list[tuple[float, float, str]]] = {}

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        self.by_device.setdefault(device_id, []).append((start_s, end_s, owner))

    def request_finished(self, outcome: object) -> None:
        pass


def _requests(rng: np.random.Generator, tenant: str, model: str, n: int, rate: float) -> list[RequestSpec]:
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return [RequestSpec(f"{tenant}:{i}", tenant, model, float(t[i]), int(rng.integers(50, 1500)),
                        int(rng.integers(4, 200))) for i in range(n)]


def _stages(layers: int, devices: tuple[str, ...], cuts: list[int]) -> tuple[SliceStage, ...]:
    """Layers 0..layers-1 cut at ``cuts`` (sorted, distinct), slices dealt to ``devices`` in turn."""
    bounds = [0, *cuts, layers]
    return tuple(SliceStage(devices[i % len(devices)], a, b - 1) for i, (a, b) in enumerate(itertools.pairwise(bounds)))


def _cluster(seed: int, stages: tuple[SliceStage, ...], owner_rate: float, guest_rate: float,
             turns: bool = False) -> tuple[SimulatedCluster, Spans]:
    """Owners: a 7B on gpu1 and gpu2; the busy 13B tenant at home on gpu0 plus a sliced replica."""
    spans = Spans()
    homes = [ReplicaSpec("own1/1", "llama2-7b", ("node0/gpu1",), tenant_id="own1"),
             ReplicaSpec("own2/1", "llama2-7b", ("node0/gpu2",), tenant_id="own2"),
             ReplicaSpec("busy/1", "llama2-13b", ("node0/gpu0",), tenant_id="busy")]
    c = SimulatedCluster(A100, homes, RooflineCostModel(), rng=np.random.default_rng(seed), observers=[spans],
                         record_log=True)
    devices = tuple(dict.fromkeys(s.device_id for s in stages))
    assert c.add_replica(ReplicaSpec(GUEST, "llama2-13b", devices, tenant_id="busy", guest=True, stages=stages,
                                     turns=turns), weights_from="node0/gpu0") is not None
    rng = np.random.default_rng(seed)
    work = (_requests(rng, "own1", "llama2-7b", 40, owner_rate) + _requests(rng, "own2", "llama2-7b", 40, owner_rate)
            + _requests(rng, "busy", "llama2-13b", 120, guest_rate))
    c.submit(sorted(work, key=lambda r: r.arrival_s))
    return c, spans


plans = st.tuples(st.integers(0, 10_000), st.lists(st.integers(1, 39), min_size=0, max_size=6, unique=True),
                  st.sampled_from([("node0/gpu1",), ("node0/gpu1", "node0/gpu2"), ("node0/gpu2", "node0/gpu1")]),
                  st.sampled_from([0.5, 2.0, 8.0]), st.booleans())


@pytest.mark.slow
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(plans)
def test_slices_respect_dependencies_memory_and_owner_priority(
        case: tuple[int, list[int], tuple[str, ...], float, bool]) -> None:
    seed, cuts, devices, owner_rate, turns = case
    stages = _stages(40, devices, sorted(cuts))
    c, spans = _cluster(seed, stages, owner_rate, 20.0, turns)
    # The sliced guest admits only what it can start: at most the one arrival routed to it.
    for t in np.arange(0.5, 8.01, 0.5):
        c.run(until=float(t))
        assert c.replica_state(GUEST)[0] <= 1
    # One piece of work at a time on every device, whoever's it is.
    for d, xs in spans.by_device.items():
        ordered = sorted(xs)
        for (_, e0, _), (s1, _, _) in itertools.pairwise(ordered):
            assert s1 >= e0 - 1e-9, d
    link = A100.link("node0/gpu1", "node0/gpu2")
    assert link is not None
    # Dependency safety: within an iteration the slices run in stage order, and a slice on another
    # device than its predecessor starts no earlier than the activations' arrival over the link.
    guest = sorted((e, s, d) for d, xs in spans.by_device.items() for s, e, o in xs if o == GUEST)
    # Owners always busy may starve the guest (its slices run only in their gaps and slack).
    assert guest or owner_rate > 0.5, "the sliced replica ran nothing beside quiet owners"
    done = [ev for ev in c.engine.log or [] if isinstance(ev, StageFinished) and ev.replica_id == GUEST]
    assert len(done) == len(guest)
    ran = {(ev.iteration, ev.stage): (s, e, d) for ev, (e, s, d) in zip(done, guest, strict=True)}
    for (it, k), (s1, _, d1) in ran.items():
        if k == 0:
            continue
        _, e0, d0 = ran[(it, k - 1)]
        assert d1 == stages[k].device_id and d0 == stages[k - 1].device_id
        assert s1 >= e0 + (link.latency_us * 1e-6 if d1 != d0 else 0.0) - 1e-12
    # Memory safety: nothing was ever forced over a device's limit.
    assert c.report().violations == []
    if turns:  # first come first served: owners are not given priority
        return
    # Owner priority: an owner iteration waits for at most one guest slice after it wanted the
    # device (its previous iteration's end, or the step request that woke it).
    wanted: dict[str, float] = {}
    log = c.engine.log or []
    starts = {o: sorted(s for d, xs in spans.by_device.items() for s, _, oo in xs if oo == o) for o in ("own1/1", "own2/1")}
    longest_guest = max((e - s for e, s, _ in guest), default=0.0)
    events = [(ev.time_s, ev.replica_id) for ev in log
              if isinstance(ev, (IterationFinished, StepRequested)) and ev.replica_id in starts]
    for owner, owner_starts in starts.items():
        mine = [t for t, rid in events if rid == owner]
        for s in owner_starts:
            before = [t for t in mine if t <= s + 1e-12]
            if before:
                wanted[owner] = before[-1]
                assert s - before[-1] <= longest_guest + 1e-9, (owner, s, before[-1])


def test_a_sliced_replica_holds_only_its_layers_and_frees_them_when_drained() -> None:
    stages = _stages(40, ("node0/gpu1", "node0/gpu2"), [25])
    c, _ = _cluster(1, stages, 1.0, 10.0)
    config = MODEL_CONFIGS["llama2-13b"]
    on1 = sum(a.size_bytes for a in c.ledger.allocations("node0/gpu1") if a.owner == f"{GUEST}/weights")
    on2 = sum(a.size_bytes for a in c.ledger.allocations("node0/gpu2") if a.owner == f"{GUEST}/weights")
    assert on1 == layers_weight_bytes(config, 0, 24) and on2 == layers_weight_bytes(config, 25, 39)
    assert on1 + on2 == weight_bytes(config)
    c.run(until=5.0)
    c.drain_replica(GUEST)
    c.run()
    assert GUEST not in c.replica_ids
    assert not [a for d in ("node0/gpu1", "node0/gpu2") for a in c.ledger.allocations(d) if a.owner.startswith(GUEST)]
    finished = [o for o in c.report().requests if o.replica_id == GUEST]
    assert finished and all(not o.dropped for o in finished)
    assert any(isinstance(ev, StageFinished) for ev in c.engine.log or [])


@pytest.mark.parametrize(("stages", "match"), [
    ((SliceStage("node0/gpu1", 0, 19),), "slices end at layer 19"),
    ((SliceStage("node0/gpu1", 0, 19), SliceStage("node0/gpu2", 21, 39)), "must cover layers"),
    ((SliceStage("nowhere", 0, 39),), "unknown device"),
])
def test_bad_slice_plans_are_refused_with_nothing_allocated(stages: tuple[SliceStage, ...], match: str) -> None:
    c = SimulatedCluster(A100, [], RooflineCostModel(), rng=np.random.default_rng(0))
    devices = tuple(dict.fromkeys(s.device_id for s in stages))
    with pytest.raises(InvalidInputError, match=match):
        SimulatedCluster(A100, [ReplicaSpec("x", "llama2-13b", devices, stages=stages)], RooflineCostModel(),
                         rng=np.random.default_rng(0))
    assert all(c.ledger.used_bytes(d.device_id) == 0 for d in A100.devices)


@pytest.mark.slow
def test_a_quantum_that_does_not_divide_the_layers_is_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="does not divide llama2-13b's 40 layers"):
        slice_sizes(MODEL_CONFIGS["llama2-13b"], 3)
    sizes = slice_sizes(MODEL_CONFIGS["llama2-70b"], 10)
    # the cut reads the traced graph: its weights are the parameters plus the rotary buffer (128 bytes)
    assert len(sizes) == 8 and 0 <= sum(s.weight_bytes for s in sizes) - weight_bytes(MODEL_CONFIGS["llama2-70b"]) <= 1024
    assert quantum(0.1, 80, 0.02) == 16 and quantum(1.0, 80, 0.001) == 1


def test_a_70b_tenant_borrows_devices_that_cannot_hold_its_whole_model() -> None:
    """The point of slices: no single device has room for a 70B replica, yet its layers fit
    spread over the idle headroom of devices other tenants own; the plan covers every layer, in
    order, and never takes more memory than a device has free."""
    homes = [ReplicaSpec("big/1", "llama2-70b", ("node0/gpu0", "node0/gpu1"), tenant_id="big")]
    homes += [ReplicaSpec(f"s{i}/1", "llama2-7b", (f"node0/gpu{i}",), tenant_id=f"s{i}") for i in range(2, 8)]
    c = SimulatedCluster(A100, homes, RooflineCostModel(), rng=np.random.default_rng(0))
    view = SimClusterView(c)
    c.submit([RequestSpec(f"big:{i}", "big", "llama2-70b", 0.0, 1000, 100) for i in range(50)])
    c.run(until=0.5)
    free = {d.device_id: d.free_bytes for d in view.devices()}
    assert max(free.values()) < weight_bytes(MODEL_CONFIGS["llama2-70b"])
    plans = slice_plans(view, "big/llama2-70b", 2, 0.02)
    assert plans
    for plan in plans:
        assert [a for _, a, _ in plan] == [0, *[b + 1 for _, _, b in plan[:-1]]] and plan[-1][2] == 79
        assert not {d for d, _, _ in plan} & {"node0/gpu0", "node0/gpu1"}
        used: dict[str, int] = {}
        for d, a, b in plan:
            used[d] = used.get(d, 0) + layers_weight_bytes(MODEL_CONFIGS["llama2-70b"], a, b)
        assert all(used[d] <= free[d] for d in used)
    change = ReplicaChange("big/llama2-70b", "llama2-70b", tuple(dict.fromkeys(d for d, _, _ in plans[0])), plans[0])
    applied = Scheduler(_Fixed(change)).step_and_apply(c.now_s, view)[1]
    assert applied.added and not applied.skipped
    c.run(until=30.0)
    assert c.report().violations == []
    assert any(o.replica_id == applied.added[0] for o in c.report().requests)


class _Fixed:
    name = "fixed"

    def __init__(self, change: ReplicaChange) -> None:
        self.change = change

    def step(self, now_s: float, state: object) -> Decision:
        return Decision(add=[self.change])


def test_a_sliced_guest_takes_no_share_of_the_queue_and_admits_from_its_tenants() -> None:
    """Where a whole guest takes an even share of its tenant's queue when it starts, a sliced
    one takes none and admits at each iteration what fits from the home's queue head."""
    homes = [ReplicaSpec("busy/1", "llama2-13b", ("node0/gpu0",), tenant_id="busy")]
    c = SimulatedCluster(A100, homes, RooflineCostModel(), rng=np.random.default_rng(0))
    c.submit([RequestSpec(f"busy:{i}", "busy", "llama2-13b", 0.0, 1000, 50) for i in range(400)])
    c.run(until=0.5)
    stages = _stages(40, ("node0/gpu1", "node0/gpu2"), [20])
    ready = c.add_replica(ReplicaSpec(GUEST, "llama2-13b", ("node0/gpu1", "node0/gpu2"), tenant_id="busy", guest=True,
                                      stages=stages), weights_from="node0/gpu0")
    assert ready is not None
    c.run(until=ready + 1e-9)
    waiting, running, _, _ = c.replica_state(GUEST)
    assert waiting == 0 and running > 0  # admitted from the home's queue, nothing parked on it
    c.run(until=ready + 2.0)
    c.drain_replica(GUEST)
    assert c.replica_state(GUEST)[0] == 0
    c.run()
    report = c.report()
    assert len(report.requests) == 400 and all(not o.dropped for o in report.requests)
    assert any(o.replica_id == GUEST for o in report.requests) and report.violations == []


def test_a_sliced_guest_that_cannot_keep_a_requests_pace_takes_no_more() -> None:
    """Once a sliced guest's last iteration waited for its owners' gaps longer than the TBT
    target of its tenant's requests, it pulls none from the home's queue and no arrival is
    routed to it; within the target it does both."""
    homes = [ReplicaSpec("busy/1", "llama2-13b", ("node0/gpu0",), tenant_id="busy")]
    c = SimulatedCluster(A100, homes, RooflineCostModel(), rng=np.random.default_rng(0))
    c.submit([RequestSpec(f"busy:{i}", "busy", "llama2-13b", 0.01 * i, 1000, 50) for i in range(400)])
    c.run(until=0.5)
    stages = _stages(40, ("node0/gpu1", "node0/gpu2"), [20])
    ready = c.add_replica(ReplicaSpec(GUEST, "llama2-13b", ("node0/gpu1", "node0/gpu2"), tenant_id="busy", guest=True,
                                      stages=stages), weights_from="node0/gpu0")
    assert ready is not None
    c.run(until=ready + 0.5)
    guest, routing = c.state.replicas[GUEST], c._routing
    assert guest.gap_wait_s < 0.2 and c.replica_state(GUEST)[1] > 0  # idle owners: no wait, pulling
    now = ready + 0.5
    assert routing.pull_from(guest, now)  # the home's queue: its head's standard class allows 200 ms
    guest.gap_wait_s = 0.25  # waited 250 ms for gaps: past the standard class's 200 ms TBT
    assert routing.pull_from(guest, now) == []
    standard = RequestSpec("busy:s", "busy", "llama2-13b", now, 10, 5)
    batch = RequestSpec("busy:b", "busy", "llama2-13b", now, 10, 5, sla_class="batch")
    assert not routing._keeps_pace(guest, standard)  # an arrival is not routed to it either
    assert routing._keeps_pace(guest, batch)  # a batch request's 1 s target: it keeps that pace
    c.run()
    assert len(c.report().requests) == 400
