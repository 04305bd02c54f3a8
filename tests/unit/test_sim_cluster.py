"""The simulated cluster: transfers, continuous batching, memory-aware admission, SLAs,
tensor parallelism, placed slices and determinism."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from service.core.cost import OpFeatures
from service.domain.cluster import ClusterSpec
from service.domain.request import RequestSpec
from service.sim.analytic import RooflineLike
from service.sim.cluster import Placement, ReplicaSpec, SimulatedCluster, SliceSpec
from service.sim.iteration import allreduce_s
from service.sim.report import RequestOutcome
from service.sim.sla import SlaClass

MIB = 1024**2


def _spec(num_devices: int = 2, mem_bytes: int | None = None, gbps: float = 100.0,
          latency_us: float = 5.0) -> ClusterSpec:
    devices = [{"device_id": f"h/gpu{i}", "kind": "A100-80GB", **({"mem_bytes": mem_bytes} if mem_bytes else {})}
               for i in range(num_devices)]
    return ClusterSpec.from_dict({"name": "t", "hosts": [{
        "host_id": "h", "devices": devices, "intra_link": {"gbps": gbps, "latency_us": latency_us}}]})


def _sim(replicas: list[ReplicaSpec], *, spec: ClusterSpec | None = None, seed: int = 0,
         **kw: object) -> SimulatedCluster:
    return SimulatedCluster(spec or _spec(), replicas, RooflineLike(), rng=np.random.default_rng(seed), **kw)  # type: ignore[arg-type]


def _req(i: int, at: float, prompt: int, output: int, *, tenant: str = "t", model: str = "tiny",
         sla: str = "standard") -> RequestSpec:
    return RequestSpec(f"q{i}", tenant, model, at, prompt, output, sla_class=sla)


class Timeline:
    """An observer that records every executed slice."""

    def __init__(self) -> None:
        self.slices: list[tuple[str, float, float, str]] = []

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        self.slices.append((device_id, start_s, end_s, owner))

    def request_finished(self, outcome: RequestOutcome) -> None:
        pass


def _by_id(sim: SimulatedCluster) -> dict[str, RequestOutcome]:
    return {o.request_id: o for o in sim.report().requests}


# ---- transfers ---------------------------------------------------------------------------

def test_a_link_serialises_transfers_fifo_and_adds_latency_once_per_transfer() -> None:
    sim = _sim([], spec=_spec(gbps=80.0, latency_us=10.0))  # 10 GB/s
    a = sim.transfer("h/gpu0", "h/gpu1", 10_000_000)  # 1 ms on the wire
    b = sim.transfer("h/gpu0", "h/gpu1", 20_000_000)  # waits for a, then 2 ms
    back = sim.transfer("h/gpu1", "h/gpu0", 10_000_000)  # the other direction is its own link
    assert (a.start_s, a.arrival_s) == (0.0, pytest.approx(1e-3 + 10e-6, abs=1e-15))
    assert (b.start_s, b.arrival_s) == (pytest.approx(1e-3), pytest.approx(3e-3 + 10e-6, abs=1e-15))
    assert (back.start_s, back.arrival_s) == (0.0, pytest.approx(1e-3 + 10e-6, abs=1e-15))
    sim.run()
    assert sim.now_s == pytest.approx(3e-3 + 10e-6)
    c = sim.transfer("h/gpu0", "h/gpu1", 10_000_000)  # link idle again: starts now
    assert c.start_s == sim.now_s and c.arrival_s == pytest.approx(sim.now_s + 1e-3 + 10e-6)
    sim.run()
    assert all(sim.ledger.used_by_kind(d)["transfer_buffer"] == 0 for d in sim.ledger.device_ids)


def test_a_transfer_without_a_link_is_refused() -> None:
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [
        {"host_id": "a", "devices": {"kind": "A100-80GB", "count": 1}},
        {"host_id": "b", "devices": {"kind": "A100-80GB", "count": 1}}]})
    sim = _sim([], spec=spec)
    with pytest.raises(Exception, match="no link"):
        sim.transfer("a/gpu0", "b/gpu0", 10)


# ---- continuous batching -----------------------------------------------------------------

def test_one_request_runs_one_prefill_then_one_decode_per_further_token() -> None:
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",))])
    sim.submit([_req(0, 0.5, prompt=40, output=5)])
    sim.run()
    table = sim.cost_table("r")
    prefill = table.latency_s(40, 40 * 40, 40, 1, 0, 0)
    decodes = [table.latency_s(0, 0, 0, 0, 1, 40 + i) for i in range(4)]
    o = _by_id(sim)["q0"]
    assert o.ttft_s == pytest.approx(prefill, rel=1e-12)
    assert o.e2e_s == pytest.approx(prefill + sum(decodes), rel=1e-12)
    assert o.tbt_max_s == pytest.approx(max(decodes), rel=1e-12)
    assert o.tbt_mean_s == pytest.approx(sum(decodes) / 4, rel=1e-12)
    assert sim.report().devices["h/gpu0"].num_slices == 5


def test_a_long_prompt_is_prefilled_in_chunks_before_its_first_token() -> None:
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",), max_batched_tokens=128)])
    sim.submit([_req(0, 0.0, prompt=300, output=2)])
    sim.run()
    t = sim.cost_table("r")
    chunks = [t.latency_s(128, 128 * 128, 128, 1, 0, 0), t.latency_s(128, 128 * 256, 256, 1, 0, 0),
              t.latency_s(44, 44 * 300, 300, 1, 0, 0)]
    o = _by_id(sim)["q0"]
    assert o.first_token_s == pytest.approx(sum(chunks), rel=1e-12)
    assert sim.report().devices["h/gpu0"].num_slices == 4


def test_simultaneous_arrivals_share_their_first_iteration() -> None:
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",))])
    sim.submit([_req(0, 0.0, 30, 3), _req(1, 0.0, 50, 3)])
    sim.run()
    got = _by_id(sim)
    assert got["q0"].first_token_s == got["q1"].first_token_s
    assert got["q0"].finish_s == got["q1"].finish_s


def test_a_late_arrival_joins_the_running_batch_at_the_next_iteration() -> None:
    timeline = Timeline()
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",))], observers=[timeline])
    sim.submit([_req(0, 0.0, 30, 50), _req(1, 1e-4, 30, 3)])
    sim.run()
    got = _by_id(sim)
    ends = [end for _, _, end, _ in timeline.slices]
    next_end = min(e for e in ends if e >= 1e-4)
    assert got["q1"].admitted_s == next_end  # admitted when the iteration in flight ended
    assert got["q1"].finish_s < got["q0"].finish_s  # decoded alongside q0, not after it
    assert len(ends) == 50  # one iteration per q0 token: q1 never needed an iteration of its own


def test_admission_waits_until_kv_fits() -> None:
    # ~16 MiB devices: after weights and the activation reserve, KV for ~2,000 tokens.
    spec = _spec(mem_bytes=16 * MIB)
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",), max_batched_tokens=256)], spec=spec)
    sim.submit([_req(0, 0.0, 1800, 20), _req(1, 0.0, 1800, 20)])
    sim.run()
    got = _by_id(sim)
    assert got["q1"].admitted_s == got["q0"].finish_s
    assert not sim.report().violations
    assert sim.kv_tokens("r") == 0


def test_a_request_that_can_never_fit_or_has_no_replica_is_dropped() -> None:
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",), max_batched_tokens=256)], spec=_spec(mem_bytes=16 * MIB))
    sim.submit([_req(0, 0.0, 100_000, 10), _req(1, 0.0, 10, 10, model="gpt2-small"), _req(2, 0.0, 10, 2)])
    sim.run()
    got = _by_id(sim)
    assert got["q0"].dropped and got["q1"].dropped and not got["q2"].dropped
    assert not got["q0"].sla_met and got["q0"].slack_s == -math.inf
    assert sim.report().sla_attainment == 1.0  # dropped requests are reported, not averaged in


def test_least_loaded_routing_spreads_requests() -> None:
    sim = _sim([ReplicaSpec("a", "tiny", ("h/gpu0",)), ReplicaSpec("b", "tiny", ("h/gpu1",))])
    sim.submit([_req(i, 0.0, 20, 5) for i in range(6)])
    sim.run()
    counts: dict[str, int] = {}
    for o in sim.report().requests:
        counts[o.replica_id] = counts.get(o.replica_id, 0) + 1
    assert counts == {"a": 3, "b": 3}


# ---- SLA accounting ----------------------------------------------------------------------

def test_sla_met_and_slack_follow_the_class_targets() -> None:
    classes = {"standard": SlaClass("standard", 10.0, 10.0, 10.0),
               "tight": SlaClass("tight", ttft_s=1e-9, tbt_s=10.0, e2e_s=10.0)}
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",))], sla_classes=classes)
    sim.submit([_req(0, 0.0, 30, 4, tenant="a", sla="standard"), _req(1, 0.0, 30, 4, tenant="b", sla="tight")])
    sim.run()
    report = sim.report()
    got = {o.request_id: o for o in report.requests}
    a, b = got["q0"], got["q1"]
    assert a.sla_met and not b.sla_met
    assert a.slack_s == pytest.approx(min(10.0 - a.ttft_s, 10.0 - a.tbt_max_s, 10.0 - a.e2e_s))
    assert b.slack_s == pytest.approx(1e-9 - b.ttft_s)
    assert report.sla_attainment == 0.5
    assert report.sla_attainment_by_tenant == {"a": 1.0, "b": 0.0}


# ---- devices, tensor parallelism, placed slices -------------------------------------------

def test_tensor_parallel_replica_splits_compute_and_pays_all_reduces() -> None:
    spec = _spec(gbps=800.0, latency_us=2.0)
    one = _sim([ReplicaSpec("r", "gpt2-small", ("h/gpu0",))], spec=spec)
    two = _sim([ReplicaSpec("r", "gpt2-small", ("h/gpu0", "h/gpu1"))], spec=spec)
    for sim in (one, two):
        sim.submit([_req(0, 0.0, 64, 1, model="gpt2-small")])
        sim.run()
    t1 = _by_id(one)["q0"].ttft_s
    t2 = _by_id(two)["q0"].ttft_s
    link = spec.link("h/gpu0", "h/gpu1")
    comm = 2 * 12 * allreduce_s(64 * 768 * 4, 2, link)
    assert t2 == pytest.approx(t1 / 2 + comm, rel=1e-9)
    rep = two.report()
    assert rep.devices["h/gpu0"].num_slices == rep.devices["h/gpu1"].num_slices == 1
    assert rep.devices["h/gpu0"].peak_mem_bytes < one.report().devices["h/gpu0"].peak_mem_bytes


def test_a_placed_slice_reserves_its_window_and_the_replica_waits_behind_it() -> None:
    timeline = Timeline()
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",))], observers=[timeline])
    ops = (OpFeatures("linear", 1e12, 1e9),)  # ~5.3 ms on an A100 at 60 % of peak
    timing = sim.commit(SliceSpec("s", "t", ops, resident_bytes=MIB), Placement("s", "h/gpu0", 0.002))
    assert timing.start_s == 0.002
    assert timing.finish_s == pytest.approx(0.002 + sim.slice_duration_s(ops, "h/gpu0"))
    sim.submit([_req(0, 0.00199, 30, 2)])  # its prefill would overlap the reserved window
    sim.run()
    o = _by_id(sim)["q0"]
    first = next(x for x in timeline.slices if x[3] == "r")
    assert first[1] == timing.finish_s  # waited for the slice instead of overlapping it
    assert o.ttft_s > timing.finish_s - 0.00199
    hist = sim.report().devices["h/gpu0"].idle_histogram
    assert hist["1-10ms"] == 1 and sum(hist.values()) == 1  # idle from 0 to 2 ms, nothing after
    assert sim.report().devices["h/gpu0"].num_slices == 3


def test_a_slice_waits_for_its_inputs_to_arrive() -> None:
    sim = _sim([], spec=_spec(gbps=80.0, latency_us=10.0))
    ops = (OpFeatures("linear", 1e9, 1e6),)
    timing = sim.commit(SliceSpec("s", "t", ops, input_bytes=10_000_000, input_device_id="h/gpu1"),
                        Placement("s", "h/gpu0", 0.0))
    assert timing.inputs_ready_s == pytest.approx(1e-3 + 10e-6)
    assert timing.start_s == timing.inputs_ready_s
    sim.run()
    assert sim.ledger.used_bytes("h/gpu0") == 0


def test_utilisation_and_idle_windows_are_reported() -> None:
    sim = _sim([ReplicaSpec("r", "tiny", ("h/gpu0",))])
    sim.submit([_req(0, 0.0, 30, 3), _req(1, 0.5, 30, 3)])
    sim.run()
    dev = sim.report().devices["h/gpu0"]
    assert 0.0 < dev.utilisation < 0.01
    assert dev.idle_histogram["0.1-1s"] == 1  # the gap between the two requests
    assert sum(dev.idle_histogram.values()) == 1
    assert sim.report().devices["h/gpu1"].idle_histogram[">=10s"] == 0


# ---- determinism -------------------------------------------------------------------------

def _random_run(seed: int) -> tuple[list[object], list[RequestOutcome]]:
    gen = np.random.default_rng(123)  # the workload is fixed; only the simulator's seed varies
    reqs = sorted((_req(i, float(gen.uniform(0, 0.02)), int(gen.integers(1, 300)), int(gen.integers(1, 30)))
                   for i in range(40)), key=lambda r: r.arrival_s)
    sim = _sim([ReplicaSpec(f"r{i}", "tiny", (f"h/gpu{i % 2}",), max_batched_tokens=256) for i in range(4)],
               seed=seed, record_log=True)
    sim.submit(reqs)
    sim.run()
    assert sim.engine.log is not None
    return list(sim.engine.log), sim.report().requests


def test_same_seed_gives_an_identical_event_log() -> None:
    log_a, out_a = _random_run(7)
    log_b, out_b = _random_run(7)
    assert log_a == log_b and len(log_a) > 100
    assert out_a == out_b


def test_replicas_sharing_a_device_take_turns_and_wake_each_other_when_kv_frees() -> None:
    # Two replicas on one small device: b's request waits for a's KV, then is woken.
    spec = _spec(mem_bytes=16 * MIB)
    timeline = Timeline()
    sim = _sim([ReplicaSpec("a", "tiny", ("h/gpu0",), max_batched_tokens=128),
                ReplicaSpec("b", "tiny", ("h/gpu0",), max_batched_tokens=128)], spec=spec, observers=[timeline],
               router=lambda req, ids, cluster: "a" if req.request_id == "q0" else "b")
    sim.submit([_req(0, 0.0, 1500, 10), _req(1, 0.0, 1500, 10)])
    sim.run()
    got = _by_id(sim)
    assert got["q1"].admitted_s == got["q0"].finish_s
    windows = sorted((start, end) for _, start, end, _ in timeline.slices)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(windows))  # no overlap
