"""Placement: container sizing, run-time replicas in the simulator, and the replica and slice policies."""

from __future__ import annotations

import numpy as np
import pytest

from learned.roofline import RooflineCostModel
from service.cluster.spec import load_cluster_spec
from service.core.placement import ContainerPlacementPolicy, ReplicaPlacementPolicy, TenantDemand, container_replicas
from service.core.policies import make_placement_policy
from service.core.scheduler import Decision, ReplicaChange, Scheduler
from service.core.slicing import SlicePlacementPolicy
from service.domain.error import InvalidInputError, InvariantError
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec, Workload
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.iteration import kv_bytes_per_token, weight_bytes

A100 = load_cluster_spec("8xA100-nvlink")


def wb(model: str) -> int:
    return weight_bytes(MODEL_CONFIGS[model])


def reserve(model: str) -> int:
    return 8192 * kv_bytes_per_token(MODEL_CONFIGS[model])


def test_container_sizing_follows_load_shares_with_tensor_parallel_groups() -> None:
    demands = [TenantDemand("big", "llama2-70b", 3.0), TenantDemand("mid", "llama2-13b", 3.0),
               TenantDemand("small", "llama2-7b", 0.1)]
    groups = container_replicas(A100, demands, weight_bytes=wb, reserve_bytes=reserve)
    devices = [d for _, _, ds in groups for d in ds]
    assert len(devices) == len(set(devices)) == 8  # whole devices, none shared, all used
    by_tenant: dict[str, list[tuple[str, ...]]] = {}
    for tenant, _, ds in groups:
        by_tenant.setdefault(tenant, []).append(ds)
    assert all(len(ds) == 2 for ds in by_tenant["big"])  # 70B needs two A100s per replica
    assert len(by_tenant["small"]) == 1  # at least one replica even with little load
    assert sum(len(ds) for ds in by_tenant["big"]) >= 2 and len(by_tenant["mid"]) >= 2


def test_container_sizing_refuses_more_tenants_than_devices() -> None:
    demands = [TenantDemand(f"t{i}", "llama2-70b", 1.0) for i in range(5)]
    with pytest.raises(InvalidInputError, match="cannot hold"):
        container_replicas(A100, demands, weight_bytes=wb, reserve_bytes=reserve)


def requests(tenant: str, model: str, n: int, gap_s: float, prompt: int = 512, out: int = 64) -> list[RequestSpec]:
    return [RequestSpec(f"{tenant}:{i}", tenant, model, i * gap_s, prompt, out) for i in range(n)]


def two_tenant_cluster() -> SimulatedCluster:
    reps = [ReplicaSpec("a/1", "llama2-7b", ("node0/gpu0",), tenant_id="a"),
            ReplicaSpec("b/1", "llama2-7b", ("node0/gpu1",), tenant_id="b")]
    return SimulatedCluster(A100, reps, RooflineCostModel(), rng=np.random.default_rng(0))


def test_requests_only_reach_their_own_tenants_replicas() -> None:
    c = two_tenant_cluster()
    c.submit(Workload("w", sorted(requests("a", "llama2-7b", 20, 0.01) + requests("b", "llama2-7b", 5, 0.05),
                                  key=lambda r: r.arrival_s)))
    c.run()
    outcomes = c.report().requests
    assert len(outcomes) == 25
    assert all(o.replica_id.split("/")[0] == o.tenant_id for o in outcomes)


def test_a_guest_replica_gets_ready_after_its_weights_arrive_and_takes_queued_work() -> None:
    c = two_tenant_cluster()
    c.submit(requests("a", "llama2-7b", 400, 0.0, prompt=2000, out=200))
    c.run(until=0.5)
    waiting_before = c.replica_state("a/1")[0]
    assert waiting_before > 0
    now = c.now_s
    ready = c.add_replica(ReplicaSpec("a/g1", "llama2-7b", ("node0/gpu2",), tenant_id="a", guest=True),
                          weights_from="node0/gpu0")
    link = A100.link("node0/gpu0", "node0/gpu2")
    assert link is not None and ready is not None
    assert ready == pytest.approx(now + wb("llama2-7b") / link.bytes_per_s + link.latency_us * 1e-6, rel=1e-9)
    assert c.replica_state("a/g1")[0] == 0  # nothing before its weights are there
    c.run(until=ready + 1e-9)
    assert c.replica_state("a/g1")[0] + c.replica_state("a/g1")[1] > 0
    c.run()
    report = c.report()
    assert len(report.requests) == 400 and not report.violations
    assert any(o.replica_id == "a/g1" for o in report.requests)


def test_a_replica_whose_weights_do_not_fit_is_refused_and_changes_nothing() -> None:
    c = two_tenant_cluster()
    before = c.ledger.used_bytes("node0/gpu1")
    assert c.add_replica(ReplicaSpec("x/g", "llama2-70b", ("node0/gpu1",), tenant_id="x", guest=True)) is None
    assert c.ledger.used_bytes("node0/gpu1") == before
    assert "x/g" not in c.replica_ids


def test_draining_moves_queued_work_and_frees_memory() -> None:
    c = two_tenant_cluster()
    c.add_replica(ReplicaSpec("a/g1", "llama2-7b", ("node0/gpu2",), tenant_id="a", guest=True))
    c.submit(requests("a", "llama2-7b", 200, 0.0, prompt=2000, out=100))
    c.run(until=0.2)
    c.drain_replica("a/g1")
    c.run()
    assert "a/g1" not in c.replica_ids
    assert c.ledger.used_bytes("node0/gpu2") == 0
    assert len(c.report().requests) == 200


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["replica", "slice"])
def test_replica_and_slice_policies_fill_an_idle_device_and_never_overflow_memory(placement: str) -> None:
    from service.sim.view import SimClusterView

    def run(policy: ContainerPlacementPolicy | ReplicaPlacementPolicy | SlicePlacementPolicy
            ) -> tuple[float, int, int]:
        c = two_tenant_cluster()
        view = SimClusterView(c)
        sched = Scheduler(policy)
        # Tenant a is overloaded; tenant b barely uses its device.
        work = sorted(requests("a", "llama2-7b", 1500, 0.02, prompt=1500, out=150)
                      + requests("b", "llama2-7b", 10, 3.0), key=lambda r: r.arrival_s)
        c.submit(work)
        guests = 0
        for step in range(1, 7):
            c.run(until=5.0 * step)
            view.mark()
            _, applied = sched.step_and_apply(c.now_s, view)
            guests += len(applied.added)
        c.run(until=30.0)
        tokens = sum(o.num_output_tokens for o in c.report().requests if o.finish_s <= 30.0)
        return tokens, guests, len(c.report().violations)

    base_tokens, base_guests, _ = run(ContainerPlacementPolicy())
    policy = ReplicaPlacementPolicy(horizon_s=10.0) if placement == "replica" else SlicePlacementPolicy(horizon_s=10.0)
    slice_tokens, guests, violations = run(policy)
    assert base_guests == 0 and guests >= 1
    assert slice_tokens > 1.2 * base_tokens
    assert violations == 0


def test_scheduler_rejects_decisions_on_unknown_devices() -> None:
    from service.sim.view import SimClusterView

    class Rogue:
        name = "rogue"

        def step(self, now_s: float, state: object) -> Decision:
            return Decision(add=[ReplicaChange("a/llama2-7b", "llama2-7b", ("nowhere",))])

    view = SimClusterView(two_tenant_cluster())
    with pytest.raises(InvariantError):
        Scheduler(Rogue()).step(0.0, view)  # type: ignore[arg-type]


def test_replica_what_if_predicts_what_the_simulator_then_does() -> None:
    """With no arrivals in the last horizon (an empty forecast) and none to come, the what-if of
    a new replica equals what the cluster does once the same change is applied."""
    from service.sim.view import SimClusterView

    horizon = 5.0
    c = two_tenant_cluster()
    c.submit(requests("a", "llama2-7b", 400, 0.001, prompt=1500, out=150))  # all arrived by 0.4 s
    c.run(until=horizon + 1.0)
    view = SimClusterView(c)
    change = ReplicaChange("a/llama2-7b", "llama2-7b", ("node0/gpu2",))
    _, predicted = view.what_if(change, horizon)
    assert predicted is not None
    now, tokens_before = c.now_s, c.tokens_out
    violations_before, done_before = len(c.ledger.violations), len(c.metrics.outcomes)
    assert view.apply(Decision(add=[change])).added
    c.run(until=now + horizon)
    late: dict[str, int] = {}
    for o in c.metrics.outcomes[done_before:]:
        if not o.sla_met:
            late[o.tenant_id] = late.get(o.tenant_id, 0) + 1
    for req in c.late_in_flight(now + horizon):  # past its deadline, or past its TTFT target without a token
        late[req.tenant_id] = late.get(req.tenant_id, 0) + 1
    assert predicted.output_tokens == c.tokens_out - tokens_before > 0
    assert predicted.violations_by_tenant == late
    assert predicted.memory_violations == len(c.ledger.violations) - violations_before


def test_a_home_busy_with_another_models_guest_needs_no_headroom() -> None:
    """The headroom rule reads a home's busy share; one that hosts another model's guest is busy
    partly with lent time, and its owners' backlog drains that guest: no guest ahead of a
    backlog for it (measured live, globex's got one on acme's saturated home)."""
    from service.core.placement import headroom_models
    from service.core.scheduler import ReplicaInfo

    def replica(model: str, unit: str, guest: bool = False) -> ReplicaInfo:
        return ReplicaInfo(f"{model}@{unit}", model.split("/")[0], model, "tiny", (unit,), 0, 1, guest, False, 0.0)

    homes = [replica("acme/m", "exec-a"), replica("globex/m", "exec-b"), replica("initech/m", "exec-c")]
    busy = {"exec-a": 0.9, "exec-b": 0.6, "exec-c": 0.7}
    assert list(headroom_models(homes, busy, 0.5, set())) == ["acme/m", "initech/m", "globex/m"]
    with_guest = [*homes, replica("acme/m", "exec-b", guest=True)]
    assert list(headroom_models(with_guest, busy, 0.5, set())) == ["initech/m"]  # acme has its guest


@pytest.mark.parametrize("headroom", [None, 0.5])
def test_a_busy_home_gets_a_guest_ahead_of_a_backlog_only_with_headroom_set(headroom: float | None) -> None:
    """Tenant a keeps its device busy but never queues two requests (it does not press); the
    other devices are idle or nearly. With ``headroom_utilisation`` the policy places a's guest
    on one anyway, where the what-if predicts no tenant worse off; without it, no backlog, no
    guest."""
    from service.sim.view import SimClusterView

    c = two_tenant_cluster()
    view = SimClusterView(c)
    policy = ReplicaPlacementPolicy(horizon_s=10.0, min_backlog=10_000, headroom_utilisation=headroom)
    c.submit(sorted(requests("a", "llama2-7b", 40, 0.25, prompt=1500, out=300) + requests("b", "llama2-7b", 2, 4.0),
                    key=lambda r: r.arrival_s))
    c.run(until=5.0)
    view.mark()
    busy = {d.device_id: d.utilisation for d in view.devices()}
    assert busy["node0/gpu0"] >= 0.5 > busy["node0/gpu1"]
    decision, applied = Scheduler(policy).step_and_apply(c.now_s, view)
    if headroom is None:
        assert not decision.add and decision.num_whatifs == 0
    else:
        (change,) = decision.add
        assert change.model_uid == "a/llama2-7b" and "node0/gpu0" not in change.device_ids
        assert applied.added and "ahead of a backlog" in decision.notes[0]
    with pytest.raises(InvalidInputError, match="headroom_utilisation"):
        make_placement_policy("replica", headroom_utilisation=1.5)
