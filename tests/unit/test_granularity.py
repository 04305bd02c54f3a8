"""The ``slice`` policy, one placement over every granularity: on random small mixes it judges
every guest replica ``replica`` judges from the same state and never picks a plan the what-if
scores below the best of them; it offers the whole model on one device, finer cuts and both
sharing modes; and the named baselines are registered."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from learned.roofline import RooflineCostModel
from service.cluster.spec import load_cluster_spec
from service.core.granularity import GranularPlacementPolicy, quanta
from service.core.placement import ReplicaPlacementPolicy, is_safe
from service.core.policies import PLACEMENT_POLICIES, make_placement_policy
from service.core.scheduler import Decision, WhatIfRun
from service.core.slicing import SlicePlacementPolicy
from service.domain.request import RequestSpec
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.view import SimClusterView

A100 = load_cluster_spec("8xA100-nvlink")
MODELS = ("llama2-7b", "llama2-13b")


def _requests(rng: np.random.Generator, tenant: str, model: str, rate: float, until_s: float) -> list[RequestSpec]:
    n = max(1, int(rate * until_s))
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return [RequestSpec(f"{tenant}:{i}", tenant, model, float(t[i]), int(rng.integers(100, 2000)),
                        int(rng.integers(16, 300))) for i in range(n) if t[i] < until_s]


def _mix(seed: int, models: list[str], rates: list[float]) -> tuple[SimulatedCluster, SimClusterView]:
    """One tenant per model, each at home on its own device, run for a few seconds."""
    homes = [ReplicaSpec(f"t{i}/1", m, (f"node0/gpu{i}",), tenant_id=f"t{i}") for i, m in enumerate(models)]
    c = SimulatedCluster(A100, homes, RooflineCostModel(), rng=np.random.default_rng(seed))
    view = SimClusterView(c)
    rng = np.random.default_rng(seed + 1)
    work = [r for i, (m, rate) in enumerate(zip(models, rates, strict=True)) for r in _requests(rng, f"t{i}", m, rate, 6.0)]
    c.submit(sorted(work, key=lambda r: r.arrival_s))
    c.run_to(4.0)
    view.mark()
    return c, view


def _score(run: WhatIfRun) -> tuple[int, int] | None:
    """What :func:`best_by_what_if` ranks a change by: (requests spared lateness, tokens gained);
    ``None`` for a change it may not pick (unsafe, no fit, or no good done)."""
    if run.changed is None or not is_safe(run.changed, run.baseline):
        return None
    spared = sum(run.baseline.violations_by_tenant.values()) - sum(run.changed.violations_by_tenant.values())
    gain = run.changed.output_tokens - run.baseline.output_tokens
    return (spared, gain) if spared > 0 or gain > 0 else None


def _chosen(decision: Decision) -> tuple[int, int] | None:
    if not decision.add:
        return None
    runs = [r for r in decision.whatifs if r.change == decision.add[0]]
    assert runs, "the chosen change was judged by a what-if"
    return _score(runs[0])


mixes = st.tuples(st.integers(0, 10_000), st.lists(st.sampled_from(MODELS), min_size=2, max_size=4),
                  st.floats(6.0, 30.0), st.floats(0.05, 2.0))


@settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(mixes)
def test_the_unified_policy_never_scores_below_the_best_replica_plan(case: tuple[int, list[str], float, float]) -> None:
    seed, models, busy_rate, light_rate = case
    rates = [busy_rate] + [light_rate] * (len(models) - 1)  # the first tenant is backlogged
    _, view = _mix(seed, models, rates)
    replica = ReplicaPlacementPolicy(horizon_s=5.0).step(view.now_s, view)
    unified = GranularPlacementPolicy(horizon_s=5.0).step(view.now_s, view)  # what-ifs change nothing
    # It judged every guest replica replica judged (same state, same what-if: same figures) ...
    judged = {r.change: r for r in unified.whatifs}
    for run in replica.whatifs:
        assert run.change in judged
        assert _score(judged[run.change]) == _score(run)
    # ... and picked nothing the what-if scores below the best of them, nor below replica's pick.
    best_replica = max((s for r in replica.whatifs if (s := _score(r)) is not None), default=None)
    picked = _chosen(unified)
    if best_replica is not None:
        assert picked is not None and picked >= best_replica
    replica_pick = _chosen(replica)
    assert replica_pick is None or (picked is not None and picked >= replica_pick)
    # It picked the best it judged.
    best_any = max((s for r in unified.whatifs if (s := _score(r)) is not None), default=None)
    assert picked == best_any


def test_it_offers_every_granularity_and_both_sharing_modes() -> None:
    """A backlogged 7B beside idle owners: whole guest replicas, the whole model on one device
    under owner priority, finer cuts, and multi-device plans under turns as well."""
    homes = [ReplicaSpec("busy/1", "llama2-7b", ("node0/gpu0",), tenant_id="busy")]
    homes += [ReplicaSpec(f"o{i}/1", "llama2-13b", (f"node0/gpu{i}",), tenant_id=f"o{i}") for i in range(1, 8)]
    c = SimulatedCluster(A100, homes, RooflineCostModel(), rng=np.random.default_rng(0))
    view = SimClusterView(c)
    c.submit([RequestSpec(f"busy:{i}", "busy", "llama2-7b", 0.0, 1000, 100) for i in range(300)])
    c.run_to(1.0)
    policy = GranularPlacementPolicy(horizon_s=2.0, max_slice_plans=8)
    changes = list(policy.sliced_changes(view, "busy/llama2-7b", "llama2-7b", set()))
    assert changes
    whole = [ch for ch in changes if len(ch.stages) == 1]
    assert whole and not whole[0].turns and whole[0].stages[0][1:] == (0, 31)
    assert any(len(ch.stages) > 1 for ch in changes)
    for ch in changes:
        assert [a for _, a, _ in ch.stages] == [0, *[b + 1 for _, _, b in ch.stages[:-1]]] and ch.stages[-1][2] == 31
        assert "node0/gpu0" not in ch.device_ids
        assert not ch.turns or len(ch.device_ids) > 1
    decision = policy.step(c.now_s, view)
    assert any(not r.change.stages for r in decision.whatifs)  # replica's candidates are judged too
    assert any(r.change.stages for r in decision.whatifs)


def test_quanta_run_from_the_whole_model_to_the_fixed_quantum() -> None:
    assert quanta(32, 4) == [32, 8, 4]
    assert quanta(40, 10) == [40, 10]
    assert quanta(80, 1) == [80, 20, 1]


def test_the_baselines_keep_their_names() -> None:
    assert {"container", "replica", "slice", "slice-fixed"} <= set(PLACEMENT_POLICIES)
    assert isinstance(make_placement_policy("slice"), GranularPlacementPolicy)
    fixed = make_placement_policy("slice-fixed")
    assert isinstance(fixed, SlicePlacementPolicy) and fixed.name == "slice-fixed"
    assert isinstance(make_placement_policy("replica"), ReplicaPlacementPolicy)
