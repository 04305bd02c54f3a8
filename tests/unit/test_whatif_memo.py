"""What-ifs made faster give the same answers (issue 37, item 4).

Two memos serve the what-ifs: iteration-cost tables that price the same thing share one memo
(:class:`service.sim.iteration.CostTables`, shared with every fork), and a step's runs without a
change are simulated once per affected set (:class:`service.sim.whatif.WhatIf`). Both may only
save work: a replay with them gives the same report, field by field, as the old path (a fresh
memo per table, every baseline simulated), and a memoised baseline equals a fresh one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from learned.roofline import RooflineCostModel
from service.core.scheduler import WhatIfOutcome
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec
from service.replay.mix import parse_mix
from service.sim import iteration, whatif
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.iteration import CostTables, IterationCostTable
from service.sim.whatif import WhatIf
from tests.unit.test_sim_time import EIGHT_TENANTS, _assert_same_report, _cluster_spec, _replay, _tenant, tenants


def _old_path(mp: pytest.MonkeyPatch) -> None:
    """The simulator as it was: every table with a memo of its own, every baseline simulated."""
    def cold_table(self: CostTables, config: Any, device: Any, **kw: Any) -> IterationCostTable:
        return IterationCostTable(config, self.cost_model, device, **kw)

    def every_time(self: WhatIf, device_ids: set[str], horizon_s: float, *, drain_s: float = 0.0) -> WhatIfOutcome:
        got = self._forecast_run(self.cluster.fork(device_ids), None, horizon_s, drain_s=drain_s)
        assert got is not None
        return got

    mp.setattr(iteration.CostTables, "table", cold_table)
    mp.setattr(whatif.WhatIf, "_unchanged_run", every_time)


def _report(placement: str, specs: list[tuple[str, str, float, float, int, int]], *, hosts: int, per_host: int,
            seed: int, duration_s: float, interval_s: float, horizon_s: float, max_num_seqs: int) -> Any:
    if hosts * per_host < len(specs):
        per_host = -(-len(specs) // hosts)
    mix = parse_mix({"name": "p", "duration_s": duration_s,
                     "tenants": [_tenant(i, *spec) for i, spec in enumerate(specs)]})
    return _replay(mix, _cluster_spec(hosts, per_host), placement, seed=seed, duration_s=duration_s,
                   interval_s=interval_s, horizon_s=horizon_s, max_num_seqs=max_num_seqs)


# Seeds other than the headline's (0-4).
@pytest.mark.parametrize("placement,seed", [("container", 8), ("replica", 9), ("slice", 11), ("slice", 8)])
def test_a_replay_with_the_memos_equals_the_old_path(placement: str, seed: int) -> None:
    kw: dict[str, Any] = dict(hosts=2, per_host=4, seed=seed, duration_s=8.0, interval_s=1.5, horizon_s=5.0,
                              max_num_seqs=4)
    fast = _report(placement, EIGHT_TENANTS, **kw)
    with pytest.MonkeyPatch.context() as mp:
        _old_path(mp)
        slow = _report(placement, EIGHT_TENANTS, **kw)
    if placement != "container":
        assert fast.num_whatifs > 0  # the memos had something to do
    _assert_same_report(fast, slow)


@pytest.mark.parametrize("placement", ["replica", "slice"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=tenants, hosts=st.integers(1, 2), per_host=st.integers(1, 3), seed=st.integers(5, 2**16),
       duration_s=st.floats(3.0, 8.0), interval_s=st.floats(0.3, 3.0), horizon_s=st.floats(2.0, 10.0),
       max_num_seqs=st.integers(2, 16))
def test_random_replays_with_the_memos_equal_the_old_path(
        placement: str, specs: list[tuple[str, str, float, float, int, int]], hosts: int, per_host: int, seed: int,
        duration_s: float, interval_s: float, horizon_s: float, max_num_seqs: int) -> None:
    kw: dict[str, Any] = dict(hosts=hosts, per_host=per_host, seed=seed, duration_s=duration_s,
                              interval_s=interval_s, horizon_s=horizon_s, max_num_seqs=max_num_seqs)
    fast = _report(placement, specs, **kw)
    with pytest.MonkeyPatch.context() as mp:
        _old_path(mp)
        slow = _report(placement, specs, **kw)
    _assert_same_report(fast, slow)


# ---- the baseline memo -------------------------------------------------------------------------

def _busy_cluster() -> SimulatedCluster:
    """Two tenants on four CPU devices, a backlog queued and a few iterations run."""
    spec = _cluster_spec(1, 4)
    devices = [d.device_id for d in spec.devices]
    homes = [ReplicaSpec("a/1", "tiny-llama", (devices[0],), tenant_id="a"),
             ReplicaSpec("b/1", "tiny", (devices[1],), tenant_id="b"),
             ReplicaSpec("b/2", "tiny", (devices[2],), tenant_id="b")]
    cluster = SimulatedCluster(spec, homes, RooflineCostModel(), rng=np.random.default_rng(3))
    rng = np.random.default_rng(4)
    reqs = [RequestSpec(f"{t}{i}", t, m, float(rng.uniform(0, 2)), int(rng.integers(50, 400)), int(rng.integers(5, 40)))
            for t, m in (("a", "tiny-llama"), ("b", "tiny")) for i in range(30)]
    cluster.submit(sorted(reqs, key=lambda r: r.arrival_s))
    cluster.run(until=2.0)
    return cluster


def test_a_memoised_baseline_equals_a_fresh_one_and_a_drains_kept_side_is_it() -> None:
    cluster = _busy_cluster()
    devices = [d.device_id for d in cluster.spec.devices]
    memo = WhatIf(cluster)
    before = cluster.version
    guest = ReplicaSpec("a/whatif", "tiny-llama", (devices[3],), tenant_id="a", guest=True)
    first_base, first_changed = memo.replica_change(guest, 3.0)
    again_base, again_changed = memo.replica_change(guest, 3.0)
    assert memo.num_baseline_runs == 1  # the second baseline came from the memo
    fresh_base, fresh_changed = WhatIf(cluster).replica_change(guest, 3.0)
    assert first_base == again_base == fresh_base
    assert first_changed == again_changed == fresh_changed
    kept, _ = memo.drain("b/2", 3.0)
    assert kept == WhatIf(cluster).drain("b/2", 3.0)[0]
    assert cluster.version == before  # what-ifs leave the cluster as it was


def test_the_memo_does_not_outlive_a_change_of_the_cluster() -> None:
    cluster = _busy_cluster()
    devices = [d.device_id for d in cluster.spec.devices]
    memo = WhatIf(cluster)
    guest = ReplicaSpec("a/whatif", "tiny-llama", (devices[3],), tenant_id="a", guest=True)
    memo.replica_change(guest, 3.0)
    version = cluster.version
    cluster.drain_replica("b/2")  # changes the state at the same time, without an event handled
    assert cluster.version != version
    after, _ = memo.replica_change(guest, 3.0)
    assert memo.num_baseline_runs == 2
    assert after == WhatIf(cluster).replica_change(guest, 3.0)[0]
    version = cluster.version
    cluster.note_arrivals([RequestSpec("late", "a", "tiny-llama", 1.5, 100, 10)])
    assert cluster.version != version
    version = cluster.version
    cluster.add_replica(ReplicaSpec("a/2", "tiny-llama", (devices[3],), tenant_id="a"))
    assert cluster.version != version


def test_tables_share_a_memo_only_where_they_price_the_same_thing() -> None:
    spec = _cluster_spec(2, 2)
    d0, d1, d2, _ = spec.devices
    tables = CostTables(RooflineCostModel())
    config = MODEL_CONFIGS["tiny-llama"]
    a, b = tables.table(config, d0), tables.table(config, d2)  # same hardware, another host
    assert a.latency_s(64, 64 * 64, 64, 1, 3, 300) == b.latency_s(64, 64 * 64, 64, 1, 3, 300)
    assert (a.num_misses, b.num_misses) == (1, 0)  # b answered from a's memo
    tp2 = tables.table(config, d0, tp_degree=2, link=spec.link(d0.device_id, d1.device_id))
    other = tables.table(MODEL_CONFIGS["tiny"], d0)
    tp2.latency_s(64, 64 * 64, 64, 1, 3, 300)
    other.latency_s(64, 64 * 64, 64, 1, 3, 300)
    assert (tp2.num_misses, other.num_misses) == (1, 1)
    cold = IterationCostTable(config, RooflineCostModel(), d2)
    assert cold.latency_s(64, 64 * 64, 64, 1, 3, 300) == a.latency_s(64, 64 * 64, 64, 1, 3, 300)
