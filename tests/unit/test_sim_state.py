"""The simulator's state forks field by field: no field without a rule, nothing mutable shared."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from service.core.batching import SIM_BATCHING, BatchingConfig
from service.domain.cluster import ClusterSpec
from service.domain.request import RequestSpec
from service.sim.analytic import RooflineLike
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.state import SimState


def _busy_cluster() -> SimulatedCluster:
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [{
        "host_id": "h", "devices": {"kind": "A100-80GB", "count": 2},
        "intra_link": {"gbps": 800, "latency_us": 2}}]})
    sim = SimulatedCluster(spec, [ReplicaSpec("r0", "tiny", ("h/gpu0",)), ReplicaSpec("r1", "tiny", ("h/gpu1",))],
                           RooflineLike(), rng=np.random.default_rng(0))
    sim.submit([RequestSpec(f"q{i}", "t", "tiny", i * 1e-4, 100, 20) for i in range(40)])
    sim.run(until=2e-3)
    return sim


def test_every_state_field_declares_its_fork_rule() -> None:
    assert all("fork" in f.metadata for f in fields(SimState))


def test_a_fork_shares_nothing_mutable_with_the_original() -> None:
    sim = _busy_cluster()
    fork = sim.fork(["h/gpu0", "h/gpu1"])
    for f in fields(SimState):
        mine, theirs = getattr(sim.state, f.name), getattr(fork.state, f.name)
        if not isinstance(mine, (bool, int, float, str)):
            assert mine is not theirs, f.name
    for rid, r in sim.state.replicas.items():
        twin = fork.state.replicas[rid]
        assert twin is not r and twin.waiting is not r.waiting and twin.prefilling is not r.prefilling
        assert [x.spec for x in twin.waiting] == [x.spec for x in r.waiting]


def test_batching_defaults_have_one_home() -> None:
    spec = ReplicaSpec("r", "tiny", ("d",))
    assert (spec.max_batched_tokens, spec.max_num_seqs) == (SIM_BATCHING.max_batched_tokens, SIM_BATCHING.max_num_seqs)
    assert BatchingConfig() == SIM_BATCHING
