"""Replicas sharing a device: first come first served turns (replay) against the executor
daemon's rule (the live mirror: weighted by time, paced by TPOT, admitting first)."""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest

import executor.settings
import executor.worker
from service.core.cost import IterationOverhead
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.sim import sharing
from service.sim.analytic import RooflineLike
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.config import SimConfig
from service.sim.replica import SliceStage
from service.sim.report import RequestOutcome
from service.sim.view import SimClusterView

CHEAP_S, COSTLY_S = 0.002, 0.03  # per-iteration overheads: the owner's model, the guest's


def _spec(devices: int = 1) -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "t", "hosts": [{"host_id": "h", "devices": [
        {"device_id": f"h/gpu{i}", "kind": "A100-80GB"} for i in range(devices)],
        "intra_link": {"gbps": 100.0, "latency_us": 5.0}}]})


class Timeline:
    """Every iteration run, per device: (start, end, replica)."""

    def __init__(self) -> None:
        self.runs: dict[str, list[tuple[float, float, str]]] = {}

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        self.runs.setdefault(device_id, []).append((start_s, end_s, owner))

    def request_finished(self, outcome: RequestOutcome) -> None:
        pass


def _sim(mode: str, replicas: list[ReplicaSpec] | None = None, devices: int = 1,
         timeline: Timeline | None = None) -> SimulatedCluster:
    replicas = replicas if replicas is not None else [
        ReplicaSpec("own/0", "tiny", ("h/gpu0",), max_num_seqs=16, tenant_id="own"),
        ReplicaSpec("gst/g0", "tiny-llama", ("h/gpu0",), max_num_seqs=16, tenant_id="gst", guest=True)]
    return SimulatedCluster(_spec(devices), replicas, RooflineLike(), rng=np.random.default_rng(0),
                            config=SimConfig(device_sharing=mode), observers=[timeline] if timeline else [],
                            overheads={"tiny": IterationOverhead(per_iteration_s=CHEAP_S),
                                       "tiny-llama": IterationOverhead(per_iteration_s=COSTLY_S)})


def _workload() -> list[RequestSpec]:
    own = [RequestSpec(f"o{i}", "own", "tiny", 0.01 * i, 20, 100, sla_class="standard") for i in range(8)]
    guest = [RequestSpec(f"g{i}", "gst", "tiny-llama", 0.01 * i, 20, 100, sla_class="interactive") for i in range(4)]
    return own + guest


def _run(mode: str) -> dict[str, list[RequestOutcome]]:
    sim = _sim(mode)
    sim.submit(_workload())
    sim.run()
    out: dict[str, list[RequestOutcome]] = {}
    for o in sim.report().requests:
        out.setdefault(o.tenant_id, []).append(o)
    return out


def test_under_turns_an_owner_with_cheap_iterations_waits_a_whole_guest_iteration_per_token() -> None:
    got = _run("turns")
    assert statistics.mean(o.tbt_mean_s for o in got["own"]) > COSTLY_S  # one of each, alternating
    assert all(o.sla_met for os in got.values() for o in os)


def test_under_executor_sharing_the_owner_runs_many_cheap_iterations_per_guest_iteration() -> None:
    turns, shared = _run("turns"), _run("executor")
    own_turns = statistics.mean(o.tbt_mean_s for o in turns["own"])
    own_shared = statistics.mean(o.tbt_mean_s for o in shared["own"])
    assert own_shared < own_turns / 4
    # the guest, interactive, still makes its TPOT target: it is due every TPOT_PACE of 100 ms
    assert all(o.sla_met for o in shared["gst"])
    assert max(o.tbt_mean_s for o in shared["gst"]) <= 0.1
    assert len(shared["own"]) == 8 and len(shared["gst"]) == 4  # nothing lost or stuck


def test_a_replica_with_a_request_waiting_for_its_prefill_is_picked_first() -> None:
    sim = _sim("executor")
    own = [RequestSpec(f"o{i}", "own", "tiny", 0.0, 20, 400, sla_class="standard") for i in range(4)]
    sim.submit([*own, RequestSpec("g0", "gst", "tiny-llama", 0.1, 20, 5, sla_class="interactive")])
    sim.run()
    g0 = next(o for o in sim.report().requests if o.request_id == "g0")
    # it waits at most the owner's one running iteration, then its own prefill iteration
    assert g0.admitted_s - g0.arrival_s <= CHEAP_S * 3
    assert g0.sla_met


def test_a_fork_under_executor_sharing_predicts_what_the_original_then_does() -> None:
    sim = _sim("executor")
    sim.submit(_workload())
    sim.run_to(0.2)
    fork = sim.fork(["h/gpu0"])
    fork.run()
    sim.run()
    key = [(o.request_id, o.first_token_s, o.finish_s) for o in sim.report().requests]
    assert sorted(key) == sorted((o.request_id, o.first_token_s, o.finish_s) for o in fork.report().requests)


def test_a_replica_on_two_devices_still_alternates_with_one_waiting_there() -> None:
    timeline = Timeline()
    sim = _sim("executor", timeline=timeline, replicas=[ReplicaSpec("own/0", "tiny", ("h/gpu0", "h/gpu1"), max_num_seqs=16, tenant_id="own"),
                            ReplicaSpec("gst/g0", "tiny-llama", ("h/gpu1",), max_num_seqs=16, tenant_id="gst",
                                        guest=True)], devices=2)
    sim.submit(_workload())
    sim.run()
    done = sim.report().requests
    assert len(done) == 12 and not any(o.dropped for o in done)
    runs = sorted(timeline.runs["h/gpu1"])
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(runs))  # one at a time
    assert {"own/0", "gst/g0"} <= {owner for *_, owner in runs[:6]}  # both run early on: neither waits out the other


def test_executor_sharing_refuses_a_sliced_replica_and_the_config_an_unknown_rule() -> None:
    with pytest.raises(InvalidInputError, match="not sliced"):
        _sim("executor", [ReplicaSpec("own/0", "tiny", ("h/gpu0",), stages=(SliceStage("h/gpu0", 0, 1),))])
    with pytest.raises(InvalidInputError, match="device_sharing"):
        SimConfig(device_sharing="round-robin")


def test_the_mirror_shares_by_the_executors_own_constants() -> None:
    assert sharing.GUEST_WEIGHT == executor.settings.GUEST_WEIGHT
    assert sharing.TPOT_PACE == executor.worker.TPOT_PACE
    assert sharing.DEFAULT_TPOT_S == executor.worker.DEFAULT_TPOT_S
    assert sharing.MIN_TPOT_S == executor.worker.MIN_TPOT_S


def test_a_drain_what_if_counts_what_a_guest_does_to_the_others_and_changes_nothing() -> None:
    # turns (replay): the owner's interactive requests wait out the guest's 150 ms iterations; the
    # guest's own requests are short, so a drained guest is gone within the horizon
    sim = SimulatedCluster(_spec(2), [
        ReplicaSpec("own/0", "tiny", ("h/gpu0",), max_num_seqs=16, tenant_id="own"),
        ReplicaSpec("gst/0", "tiny-llama", ("h/gpu1",), max_num_seqs=16, tenant_id="gst"),
        ReplicaSpec("gst/g1", "tiny-llama", ("h/gpu0",), max_num_seqs=16, tenant_id="gst", guest=True)],
        RooflineLike(), rng=np.random.default_rng(0),
        overheads={"tiny": IterationOverhead(per_iteration_s=CHEAP_S), "tiny-llama": IterationOverhead(per_iteration_s=0.15)})
    sim.submit([RequestSpec(f"o{i}", "own", "tiny", 0.001 * i, 20, 5, sla_class="interactive") for i in range(6)]
               + [RequestSpec(f"g{i}", "gst", "tiny-llama", 0.001 * i, 20, 3, sla_class="batch") for i in range(12)])
    sim.run_to(0.05)
    view = SimClusterView(sim, model_uid=lambda tenant, family: tenant)
    kept, drained = view.drain_what_if("gst/g1", 10.0)
    assert "gst" not in kept.violations_by_tenant and "gst" not in drained.violations_by_tenant
    assert kept.violations_by_tenant.get("own", 0) > drained.violations_by_tenant.get("own", 0)
    assert sim.now_s == 0.05 and "gst/g1" in sim.replica_ids  # the cluster itself is untouched
