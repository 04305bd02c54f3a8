"""The ``slice`` policy, one placement over every granularity: on random small mixes it judges
every guest replica ``replica`` judges from the same state and never picks a plan its score
puts below the best of them, and every what-if it runs is in the decision with a reason that
agrees with the figures; a wall-time cap leaves later plans unjudged; it offers the whole model on one device, finer cuts and both
sharing modes; and the named baselines are registered."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from learned.roofline import RooflineCostModel
from service.cluster.spec import load_cluster_spec
from service.core.granularity import GranularPlacementPolicy, quanta
from service.core.placement import (
    ReplicaPlacementPolicy,
    WhatIfScore,
    describe,
    is_safe,
    late_then_tokens,
    sustained_then_tokens,
)
from service.core.policies import PLACEMENT_POLICIES, make_placement_policy
from service.core.scheduler import Decision, WhatIfRun
from service.core.slicing import SlicePlacementPolicy
from service.domain.error import InvalidInputError
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


def _score(run: WhatIfRun, score: WhatIfScore = sustained_then_tokens) -> tuple[float, float] | None:
    """What :func:`best_by_what_if` ranks a change by under ``score`` (the unified policy's by
    default); ``None`` for a change it may not pick (unsafe, no fit, or no good done)."""
    if run.changed is None or not is_safe(run.changed, run.baseline):
        return None
    value = score(run.baseline, run.changed)
    return value if value > (0.0, 0.0) else None


def _chosen(decision: Decision, score: WhatIfScore = sustained_then_tokens) -> tuple[float, float] | None:
    if not decision.add:
        return None
    runs = [r for r in decision.whatifs if r.change == decision.add[0]]
    assert runs, "the chosen change was judged by a what-if"
    return _score(runs[0], score)


def _reasons_hold(decision: Decision) -> None:
    """Every what-if has a reason that agrees with its figures: one accepted (the change added)
    or none; the others beaten by it, unsafe, without fit or without gain."""
    accepted = [r for r in decision.whatifs if r.reason is not None and r.reason.verdict == "accepted"]
    assert [r.change for r in accepted] == decision.add[:1]
    for run in decision.whatifs:
        assert run.reason is not None
        verdict = run.reason.verdict
        assert (verdict == "no_fit") == (run.changed is None)
        if run.changed is None:
            continue
        assert (verdict in ("memory", "tenant_worse")) == (not is_safe(run.changed, run.baseline))
        assert run.reason.late_before == run.baseline.late and run.reason.late_after == run.changed.late
        if verdict == "tenant_worse":
            assert run.reason.tenant is not None and run.reason.late_delta > 0
            assert run.changed.violations_by_tenant[run.reason.tenant] == \
                run.baseline.violations_by_tenant.get(run.reason.tenant, 0) + run.reason.late_delta
        if verdict == "beaten":
            assert run.reason.beaten_by == describe(decision.add[0])


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
    # It judged every guest replica replica judged (same state, same what-if: the same figures
    # within the horizon; it also runs on past the horizon to see what each leaves behind) ...
    judged = {r.change: r for r in unified.whatifs}
    for run in replica.whatifs:
        assert run.change in judged
        for mine, theirs in ((judged[run.change].changed, run.changed), (judged[run.change].baseline, run.baseline)):
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert (mine.output_tokens, mine.violations_by_tenant, mine.memory_violations) == \
                    (theirs.output_tokens, theirs.violations_by_tenant, theirs.memory_violations)
    # ... and, on its own score, picked nothing below the best of them, nor below replica's pick.
    best_replica = max((s for r in replica.whatifs if (s := _score(judged[r.change])) is not None), default=None)
    picked = _chosen(unified)
    if best_replica is not None:
        assert picked is not None and picked >= best_replica
    # Replica's pick, as the unified policy scores it (None: it leaves more lateness behind the
    # horizon than it spares, and does no good on that score).
    replica_pick = _score(judged[replica.add[0]]) if replica.add else None
    assert replica_pick is None or (picked is not None and picked >= replica_pick)
    # It picked the best it judged; replica kept its own score (late requests, then tokens).
    best_any = max((s for r in unified.whatifs if (s := _score(r)) is not None), default=None)
    assert picked == best_any
    replica_scores = [s for r in replica.whatifs if (s := _score(r, late_then_tokens)) is not None]
    assert _chosen(replica, late_then_tokens) == max(replica_scores, default=None)
    # Every what-if it ran is in the decision with a reason that agrees with its figures.
    for decision in (replica, unified):
        assert decision.num_whatifs == len(decision.whatifs)
        _reasons_hold(decision)


def test_a_wall_time_cap_leaves_the_later_plans_unjudged_and_says_so() -> None:
    """With a clock that moves a second per reading and a 1.5 s cap, the step judges the first
    plans, counts the rest as skipped and notes it; a cap without a clock is refused."""
    _, view = _mix(3, ["llama2-7b", "llama2-13b", "llama2-7b"], [20.0, 0.1, 0.1])
    free = GranularPlacementPolicy(horizon_s=2.0).step(view.now_s, view)
    assert free.whatifs_skipped == 0 and free.num_whatifs >= 3
    ticks = iter(range(1000))
    capped = GranularPlacementPolicy(horizon_s=2.0, whatif_wall_s=1.5, clock=lambda: float(next(ticks)))
    decision = capped.step(view.now_s, view)
    assert decision.num_whatifs == 2  # readings 1 and 2 after the start at 0: the third is out of time
    assert decision.whatifs_skipped == free.num_whatifs - 2
    assert [r.change for r in decision.whatifs] == [r.change for r in free.whatifs[:2]]
    assert any("left unjudged" in n for n in decision.notes)
    with pytest.raises(InvalidInputError, match="clock"):
        GranularPlacementPolicy(whatif_wall_s=1.0)
    with pytest.raises(InvalidInputError):
        make_placement_policy("slice", whatif_wall_s=0.0, clock=lambda: 0.0)


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
