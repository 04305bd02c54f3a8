"""What-if: predictions on a fork equal what the full simulator does after committing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.core.cost import OpFeatures
from service.domain.cluster import ClusterSpec
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec
from service.sim.analytic import RooflineLike
from service.sim.cluster import Placement, ReplicaSpec, SimulatedCluster, SliceSpec
from service.sim.iteration import BatchFeatures, iteration_ops
from service.sim.whatif import WhatIf

MIB = 1024**2


def _cluster(seed: int = 0) -> SimulatedCluster:
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [{
        "host_id": "h", "devices": {"kind": "A100-80GB", "count": 4},
        "intra_link": {"gbps": 800, "latency_us": 2}}]})
    replicas = [ReplicaSpec("r0", "gpt2-small", ("h/gpu0",), max_batched_tokens=512),
                ReplicaSpec("r1", "gpt2-small", ("h/gpu1",), max_batched_tokens=512),
                ReplicaSpec("r23", "tiny", ("h/gpu2", "h/gpu3"))]
    sim = SimulatedCluster(spec, replicas, RooflineLike(), rng=np.random.default_rng(seed))
    gen = np.random.default_rng(5)
    reqs = []
    for i in range(30):
        model = "tiny" if i % 3 == 2 else "gpt2-small"
        reqs.append(RequestSpec(f"q{i}", f"tenant{i % 3}", model, float(gen.uniform(0, 0.002)),
                                int(gen.integers(10, 600)), int(gen.integers(2, 60))))
    sim.submit(sorted(reqs, key=lambda r: r.arrival_s))
    sim.run(until=0.003)  # every request has arrived; many are in flight
    return sim


def _slice(slice_id: str, *, tokens: int = 256, resident_bytes: int = 8 * MIB, input_bytes: int = 0,
           input_device_id: str | None = None) -> SliceSpec:
    ops = tuple(iteration_ops(MODEL_CONFIGS["gpt2-small"], BatchFeatures.of([(tokens, 0)], [])))
    return SliceSpec(slice_id, "tenant-x", ops, resident_bytes=resident_bytes, input_bytes=input_bytes,
                     input_device_id=input_device_id)


def test_prediction_equals_what_the_simulator_does_once_committed() -> None:
    sim = _cluster()
    now = sim.now_s
    candidate = (_slice("s0", input_bytes=4 * MIB, input_device_id="h/gpu1"), Placement("s0", "h/gpu0", now + 1e-4))
    in_flight = {spec.request_id for rid, spec in sim.in_flight() if rid in ("r0", "r1")}
    assert len(in_flight) >= 5

    whatif = WhatIf(sim)
    result = whatif.evaluate([candidate])
    untouched = whatif.evaluate([])
    assert untouched.request_finish_s != result.request_finish_s  # the slice does change things

    sim.ledger.reset_peaks(now)
    timing = sim.commit(*candidate)
    sim.run()
    actual = {o.request_id: o for o in sim.report().requests}
    assert result.affected_device_ids == ("h/gpu0", "h/gpu1")
    assert result.slices["s0"] == timing
    assert set(result.request_finish_s) == in_flight
    assert {q: actual[q].finish_s for q in in_flight} == result.request_finish_s
    for d in result.affected_device_ids:
        assert result.device_peak_bytes[d] == sim.ledger.peak_bytes(d)
    slack: dict[str, float] = {}
    for q in in_flight:
        slack[actual[q].tenant_id] = min(slack.get(actual[q].tenant_id, math.inf), actual[q].slack_s)
    assert result.tenant_slack_s == slack


def test_evaluate_leaves_the_cluster_untouched() -> None:
    sim = _cluster()
    before = (sim.now_s, sim.engine.num_handled, sorted(map(repr, sim.engine.pending())),
              {d: sim.ledger.used_bytes(d) for d in sim.ledger.device_ids}, sim.in_flight())
    WhatIf(sim).evaluate([(_slice("s0"), Placement("s0", "h/gpu0", sim.now_s))])
    after = (sim.now_s, sim.engine.num_handled, sorted(map(repr, sim.engine.pending())),
             {d: sim.ledger.used_bytes(d) for d in sim.ledger.device_ids}, sim.in_flight())
    assert before == after


def test_a_slice_in_a_busy_window_costs_the_tenants_on_that_device_slack() -> None:
    sim = _cluster()
    whatif = WhatIf(sim)
    result = whatif.evaluate([(_slice("big", tokens=2048), Placement("big", "h/gpu0", sim.now_s))])
    assert result.affected_device_ids == ("h/gpu0",)
    tenants_on_r0 = {spec.tenant_id for rid, spec in sim.in_flight() if rid == "r0"}
    assert set(result.tenant_slack_s) == tenants_on_r0 == set(result.baseline_tenant_slack_s)
    for t in tenants_on_r0:
        assert result.slack_delta_s(t) < 0.0
    # The baseline is memoised for the snapshot: a second candidate reuses it.
    again = whatif.evaluate([(_slice("small", tokens=16), Placement("small", "h/gpu0", sim.now_s))])
    assert again.baseline_tenant_slack_s == result.baseline_tenant_slack_s
    assert again.min_slack_s >= result.min_slack_s


def test_a_slice_on_a_tensor_parallel_replica_resimulates_both_of_its_devices_only() -> None:
    sim = _cluster()
    result = WhatIf(sim).evaluate([(_slice("s"), Placement("s", "h/gpu3", sim.now_s))])
    assert result.affected_device_ids == ("h/gpu2", "h/gpu3")
    assert set(result.device_peak_bytes) == {"h/gpu2", "h/gpu3"}
    assert set(result.tenant_slack_s) <= {"tenant2"}


def test_an_overflowing_placement_is_predicted_as_a_violation() -> None:
    sim = _cluster()
    free = sim.ledger.free_bytes("h/gpu1")
    result = WhatIf(sim).evaluate([(_slice("huge", resident_bytes=free + MIB), Placement("huge", "h/gpu1", sim.now_s))])
    assert [v.device_id for v in result.violations][:1] == ["h/gpu1"]
    assert result.device_peak_bytes["h/gpu1"] > sim.ledger.limit_bytes("h/gpu1")
    assert not sim.ledger.violations


def test_a_horizon_bounds_the_resimulation() -> None:
    sim = _cluster()
    result = WhatIf(sim, horizon_s=1e-4).evaluate([(_slice("s"), Placement("s", "h/gpu0", sim.now_s))])
    assert result.horizon_s == pytest.approx(sim.now_s + 1e-4)
    assert any(math.isinf(t) for t in result.request_finish_s.values())
    assert all(t <= result.horizon_s for t in result.request_finish_s.values() if not math.isinf(t))


def test_two_candidates_on_one_device_queue_behind_each_other() -> None:
    sim = _cluster()
    a, b = _slice("a"), _slice("b")
    result = WhatIf(sim).evaluate([(a, Placement("a", "h/gpu0", sim.now_s)),
                                   (b, Placement("b", "h/gpu0", sim.now_s))])
    assert result.slices["b"].start_s >= result.slices["a"].finish_s
    assert result.slices["a"].finish_s - result.slices["a"].start_s == pytest.approx(
        sim.slice_duration_s(a.ops, "h/gpu0"))


def test_opfeatures_of_a_slice_cost_what_the_cost_model_says() -> None:
    sim = _cluster()
    ops = (OpFeatures("linear", 2e12, 1e9),)
    duration = sim.slice_duration_s(ops, "h/gpu0")
    assert duration == pytest.approx(2e12 / (312e12 * 0.6) + 2e-6)


def test_a_request_queued_past_its_ttft_target_is_late_before_its_e2e_deadline() -> None:
    """A backlog shows in the prediction as soon as it costs TTFT: a request still waiting for
    its first token past its target counts as late at the horizon, long before its end-to-end
    deadline passes (interactive: 1 s TTFT, 60 s end to end)."""
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [{"host_id": "h", "devices": {"kind": "A100-80GB", "count": 1}}]})
    sim = SimulatedCluster(spec, [ReplicaSpec("r0", "gpt2-small", ("h/gpu0",), max_num_seqs=1)], RooflineLike(),
                           rng=np.random.default_rng(0))
    # one long request holds the only batch slot; the short ones queue behind it
    reqs = [RequestSpec("long", "t0", "gpt2-small", 0.0, 64, 4000, "interactive")]
    reqs += [RequestSpec(f"q{i}", "t0", "gpt2-small", 0.001 * (i + 1), 16, 4, "interactive") for i in range(5)]
    sim.submit(reqs)
    sim.run(until=2.0)
    late = {r.request_id for r in sim.late_in_flight(sim.now_s)}
    assert late == {f"q{i}" for i in range(5)}  # queued 2 s, no first token: late
    assert not sim.late_in_flight(0.5)  # within the 1 s target at 0.5 s
    baseline, _ = WhatIf(sim).replica_change(ReplicaSpec("g", "gpt2-small", ("h/gpu0",), tenant_id="t0"), 1.0)
    assert baseline.violations_by_tenant.get("t0", 0) >= 5


def _newcomer(seen_since: dict[str, float] | None = None) -> SimulatedCluster:
    """A mirror at 15 s whose tenant ``a`` sent ten requests over its last five seconds."""
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [{
        "host_id": "h", "devices": {"kind": "A100-80GB", "count": 2},
        "intra_link": {"gbps": 800, "latency_us": 2}}]})
    sim = SimulatedCluster(spec, [ReplicaSpec("r0", "tiny", ("h/gpu0",), tenant_id="a")], RooflineLike(),
                           rng=np.random.default_rng(0))
    sim.note_arrivals([RequestSpec(f"q{i}", "a", "tiny", 10.0 + 0.5 * i, 16, 8) for i in range(10)],
                      seen_since=seen_since)
    sim.run_to(15.0)
    return sim


def test_a_tenant_seen_for_less_than_the_horizon_is_forecast_to_go_on_as_it_began() -> None:
    """Shifting its five seconds by the 20-s horizon would have it send nothing for fifteen
    seconds, and a what-if at its start would see no load to make room for."""
    sim = _newcomer()
    forecast = WhatIf(sim)._forecast(sim, 20.0)
    assert len(forecast) == 40  # its rate, two a second, over the whole horizon
    assert all(15.0 <= r.arrival_s < 35.0 for r in forecast)
    assert len({r.request_id for r in forecast}) == 40


def test_a_tenant_watched_for_longer_than_its_window_shows_keeps_the_plain_persistence_forecast() -> None:
    """A live mirror's history is the last window: a model sending ten requests in five seconds,
    watched for minutes, is forecast to send ten in the next twenty."""
    sim = _newcomer(seen_since={"a": -100.0})
    forecast = WhatIf(sim)._forecast(sim, 20.0)
    assert [r.arrival_s for r in forecast] == [30.0 + 0.5 * i for i in range(10)]
