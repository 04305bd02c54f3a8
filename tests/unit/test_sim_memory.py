"""The memory ledger, and the simulator's memory books against a brute-force recount."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.memory import MemoryLedger
from service.domain.cluster import ClusterSpec
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec
from service.sim.analytic import RooflineLike
from service.sim.cluster import Placement, ReplicaSpec, SimulatedCluster, SliceSpec
from service.sim.iteration import BatchFeatures, iteration_ops

MIB = 1024**2


def test_allocate_refuses_above_capacity_minus_margin_and_changes_nothing() -> None:
    ledger = MemoryLedger({"d": 1000}, margin_fraction=0.1)
    assert ledger.limit_bytes("d") == 900
    a = ledger.allocate("d", "weights", "m", 600)
    assert a is not None and ledger.used_bytes("d") == 600
    assert ledger.allocate("d", "kv_cache", "r", 301) is None
    assert ledger.used_bytes("d") == 600 and not ledger.violations
    b = ledger.allocate("d", "kv_cache", "r", 300)
    assert b is not None and ledger.free_bytes("d") == 0
    ledger.check_invariants()


def test_free_returns_bytes_and_peak_remembers() -> None:
    ledger = MemoryLedger({"d": 1000}, margin_fraction=0.0)
    a = ledger.allocate("d", "activation", "s", 700, at_s=2.0)
    assert a is not None
    ledger.free(a)
    assert ledger.used_bytes("d") == 0
    assert ledger.peak_bytes("d") == 700 and ledger.peak_at_s("d") == 2.0
    with pytest.raises(KeyError):
        ledger.free(a)  # a double free is a bug, loudly


def test_overflow_always_allocates_and_records_a_violation_above_the_limit() -> None:
    ledger = MemoryLedger({"d": 1000}, margin_fraction=0.1)
    ok = ledger.overflow("d", "kv_cache", "r", 500, at_s=1.0)
    assert ok.size_bytes == 500 and not ledger.violations  # within the limit: no violation
    over = ledger.overflow("d", "kv_cache", "r", 500, at_s=3.0)
    assert ledger.used_bytes("d") == 1000
    (v,) = ledger.violations
    assert (v.device_id, v.at_s, v.owner, v.requested_bytes, v.used_bytes, v.limit_bytes) == (
        "d", 3.0, "r", 500, 1000, 900)
    ledger.free(over)
    ledger.check_invariants()


def test_resize_grows_within_the_limit_or_refuses_unless_forced() -> None:
    ledger = MemoryLedger({"d": 1000}, margin_fraction=0.0)
    a = ledger.allocate("d", "kv_cache", "r", 100)
    assert a is not None
    b = ledger.resize(a, 900)
    assert b is not None and b.alloc_id == a.alloc_id and ledger.used_bytes("d") == 900
    assert ledger.resize(b, 1001) is None and ledger.used_bytes("d") == 900
    c = ledger.resize(b, 1100, at_s=4.0, force=True)
    assert c is not None and len(ledger.violations) == 1
    d = ledger.resize(c, 10)
    assert d is not None and ledger.used_bytes("d") == 10
    assert ledger.used_by_kind("d")["kv_cache"] == 10
    ledger.check_invariants()


def test_copy_is_independent() -> None:
    ledger = MemoryLedger({"d": 1000})
    a = ledger.allocate("d", "weights", "m", 100)
    assert a is not None
    other = ledger.copy()
    other.free(a)
    other.allocate("d", "activation", "x", 50)
    assert ledger.used_bytes("d") == 100 and other.used_bytes("d") == 50


def test_check_invariants_catches_corrupt_books() -> None:
    ledger = MemoryLedger({"d": 1000})
    ledger.allocate("d", "weights", "m", 100)
    ledger._used["d"] += 1
    with pytest.raises(AssertionError, match="sum of allocations"):
        ledger.check_invariants()


# ---- the simulator's books ---------------------------------------------------------------

def _small_cluster(mem_bytes: int) -> ClusterSpec:
    return ClusterSpec.from_dict({
        "name": "small", "hosts": [{
            "host_id": "h", "intra_link": {"gbps": 100, "latency_us": 5},
            "devices": [{"device_id": f"h/gpu{i}", "kind": "A100-80GB", "mem_bytes": mem_bytes} for i in range(2)],
        }],
    })


def _recount(sim: SimulatedCluster) -> dict[str, int]:
    """Per-device bytes from first principles: weights, KV of every admitted request (reserve:
    its prompt plus its whole output, reserved at admission; paged: the tokens it has cached —
    its prompt and every output token but the newest — and one block of rounding), current iteration activations, placed slices and in-flight transfers."""
    from service.sim.iteration import activation_bytes_per_token, kv_bytes_per_token, weight_bytes

    paged, block = sim.config.kv == "paged", sim.config.kv_block_tokens
    total = dict.fromkeys((d.device_id for d in sim.spec.devices), 0)
    for r in sim.state.replicas.values():
        tokens = 0
        last_step = r.iteration - 1
        for live in r.prefilling:
            tokens += live.target + block if paged else live.spec.prompt_tokens + live.spec.output_tokens
        for lives in r.finishing.values():
            for live in lives:
                produced = live.generated + last_step - live.decode_iter
                tokens += (live.spec.prompt_tokens + produced - 1 + block if paged
                           else live.spec.prompt_tokens + live.spec.output_tokens)
        batch_tokens = sum(n for _, n in r.current) + (r.num_decodes if r.busy else 0)
        for d in r.device_ids:
            total[d] += -(-weight_bytes(r.config) // r.tp)
            total[d] += math.ceil(tokens * kv_bytes_per_token(r.config) / r.tp)
            if r.busy:
                total[d] += int(batch_tokens * activation_bytes_per_token(r.config) / r.tp)
    for placed in sim.state.slices.values():
        if placed.allocs:
            total[placed.timing.device_id] += placed.spec.resident_bytes + (
                placed.spec.input_bytes if placed.spec.input_device_id not in (None, placed.timing.device_id) else 0)
    for tid in sim.state.transfer_buffers:
        t = sim.transfer_timing(tid)
        total[t.dst] += t.size_bytes
    return total


_requests = st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(1, 600), st.integers(1, 40)),
                     min_size=1, max_size=12)
_slices = st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(0, 1), st.integers(0, 3 * MIB),
                             st.integers(0, 2 * MIB), st.booleans()), max_size=6)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=_requests, slices=_slices, seed=st.integers(0, 3))
def test_simulator_memory_equals_a_brute_force_recount_and_overflow_is_flagged(
        requests: list[tuple[float, int, int]], slices: list[tuple[float, int, int, int, bool]], seed: int) -> None:
    # Small devices (weights ~4 MiB, KV for ~1,000 tokens) so admission waits and slices overflow.
    spec = _small_cluster(12 * MIB)
    sim = SimulatedCluster(spec, [ReplicaSpec("r0", "tiny", ("h/gpu0",), max_batched_tokens=256),
                                  ReplicaSpec("r1", "tiny", ("h/gpu1",), max_batched_tokens=256)],
                           RooflineLike(), rng=np.random.default_rng(seed))
    sim.submit(sorted((RequestSpec(f"q{i}", "t", "tiny", at, p, o) for i, (at, p, o) in enumerate(requests)),
                      key=lambda r: r.arrival_s))
    ops = tuple(iteration_ops(MODEL_CONFIGS["tiny"], BatchFeatures.of([(32, 0)], [])))
    pending = sorted((at, i, dev, res, inp, move) for i, (at, dev, res, inp, move) in enumerate(slices))
    while sim.engine.peek() is not None or pending:
        if pending and (sim.engine.peek() is None or pending[0][0] <= sim.engine.peek()):  # type: ignore[operator]
            at, i, dev, res, inp, move = pending.pop(0)
            sim.run(until=at)
            before = len(sim.ledger.violations)
            device = f"h/gpu{dev}"
            src = f"h/gpu{1 - dev}" if move else None
            sim.commit(SliceSpec(f"s{i}", "t", ops, resident_bytes=res, input_bytes=inp if move else 0,
                                 input_device_id=src), Placement(f"s{i}", device, sim.now_s))
            for d in (device, src):
                if d is not None and sim.ledger.used_bytes(d) > sim.ledger.limit_bytes(d):
                    assert any(v.device_id == d for v in sim.ledger.violations[before:]), "overflow not flagged"
        else:
            sim.engine.step()
        assert _recount(sim) == {d: sim.ledger.used_bytes(d) for d in sim.ledger.device_ids}
        sim.ledger.check_invariants()
    report = sim.report()
    assert {o.request_id for o in report.requests} == {f"q{i}" for i in range(len(requests))}
    for d in sim.ledger.device_ids:  # everything released at the end but the weights
        assert sim.ledger.used_by_kind(d) == {"weights": sim.ledger.used_bytes(d), "kv_cache": 0,
                                              "activation": 0, "transfer_buffer": 0}
