"""Paged KV in the simulator: blocks grow with the tokens, the newest request is preempted
(recompute) when a decode cannot grow, and no device is ever over its limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from learned.roofline import RooflineCostModel
from service.domain.cluster import DEVICE_KINDS, ClusterSpec, Device
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.config import SimConfig

GIB = 2**30


def one_gpu(mem_gib: float) -> ClusterSpec:
    k = DEVICE_KINDS["A100-80GB"]
    return ClusterSpec("one", ["h"], [Device("g0", "h", "A100-80GB", int(mem_gib * GIB), k.peak_flops,
                                             k.mem_bw_bytes_per_s)], [])


def cluster(mem_gib: float, kv: str, max_num_seqs: int = 256) -> SimulatedCluster:
    return SimulatedCluster(one_gpu(mem_gib), [ReplicaSpec("a/1", "llama2-7b", ("g0",), tenant_id="a",
                                                           max_num_seqs=max_num_seqs)],
                            RooflineCostModel(), rng=np.random.default_rng(0), config=SimConfig(kv=kv))


def burst(n: int, prompt: int, out: int, gap_s: float = 0.001) -> list[RequestSpec]:
    return [RequestSpec(f"a:{i}", "a", "llama2-7b", i * gap_s, prompt, out) for i in range(n)]


def test_paged_admits_more_sequences_than_reserving_whole_outputs() -> None:
    """20 GiB: about 6.5 GiB of KV (13k tokens). Reserving prompt + output (1,300 tokens each)
    admits about 10 at once; paged admits by current blocks, so more run together and the burst
    ends sooner."""
    ends = {}
    for kv in ("reserve", "paged"):
        c = cluster(20, kv)
        c.submit(burst(40, 300, 1000))
        c.run()
        report = c.report()
        assert len(report.requests) == 40 and not report.violations
        ends[kv] = report.makespan_s
    assert ends["paged"] < 0.8 * ends["reserve"]


def test_decode_growth_preempts_the_newest_request_and_charges_its_recompute() -> None:
    c = cluster(20, "paged")
    c.submit(burst(40, 300, 1000))
    c.run()
    report = c.report()
    assert report.kv == "paged"
    assert report.preemptions > 0
    assert report.recomputed_tokens >= 300 * report.preemptions  # at least each victim's prompt again
    assert len({o.request_id for o in report.requests}) == 40  # each finished exactly once
    assert all(o.num_output_tokens == 1000 for o in report.requests)
    by_id = {o.request_id: o for o in report.requests}
    # Newest first: the first request admitted is never a victim, so its tokens never stall.
    assert by_id["a:0"].tbt_max_s < 1.0
    stalled = [o for o in report.requests if o.tbt_max_s > 1.0]
    assert stalled and min(int(o.request_id.split(":")[1]) for o in stalled) > 0


def test_reserve_mode_never_preempts() -> None:
    c = cluster(20, "reserve")
    c.submit(burst(40, 300, 1000))
    c.run()
    assert c.report().preemptions == 0


def test_unknown_kv_mode_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="kv must be one of"):
        SimConfig(kv="virtual")


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mem_gib=st.floats(min_value=15.0, max_value=24.0),
       lengths=st.lists(st.tuples(st.integers(1, 2500), st.integers(1, 1500)), min_size=1, max_size=40),
       gap_s=st.floats(min_value=0.0, max_value=0.05),
       max_num_seqs=st.integers(1, 64))
def test_paged_kv_never_puts_a_device_over_its_limit(mem_gib: float, lengths: list[tuple[int, int]],
                                                     gap_s: float, max_num_seqs: int) -> None:
    """Memory safety holds through admission, growth and preemption: no forced allocation over
    the limit, the peak never above it, every request done exactly once with all its tokens."""
    c = cluster(mem_gib, "paged", max_num_seqs)
    reqs = [RequestSpec(f"a:{i}", "a", "llama2-7b", i * gap_s, p, o) for i, (p, o) in enumerate(lengths)]
    c.submit(reqs)
    c.run()
    report = c.report()
    assert not report.violations
    assert c.ledger.peak_bytes("g0") <= c.ledger.limit_bytes("g0")
    done = {o.request_id: o for o in report.requests if not o.dropped}
    fits = [r for r in reqs if r.request_id in done]
    assert len(done) == len([o for o in report.requests if not o.dropped])  # no duplicates
    assert all(done[r.request_id].num_output_tokens == r.output_tokens for r in fits)
    assert c.kv_tokens("a/1") == 0  # everything released at the end
