"""The live metrics' rules on a hand-driven live state (no server, no Neo4j): finished reasons,
inter-token gaps counted once per gap, bucket edges, the KV usage cap and slices of a replica cut
over devices."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.domain.request import RequestStatus
from service.live.metrics import ITL_BUCKETS, LiveMetrics, TokenHistogram, finished_reason, inter_token_s
from service.live.records import LiveRequest
from tests.unit.test_live_state import make_state, submit


def samples(metrics: LiveMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(metrics: LiveMetrics, name: str, **labels: str) -> float:
    return samples(metrics).get((name, tuple(sorted(labels.items()))), 0.0)


def done_request(n: int, max_tokens: int, ttft_s: float, e2e_s: float) -> LiveRequest:
    return LiveRequest("r", "a", "m", [1, 2, 3], max_tokens, "standard", max_tokens, 0.0, status=RequestStatus.DONE,
                       output_tokens=[7] * n, queued_s=0.0, ttft_s=ttft_s, e2e_s=e2e_s)


def test_finished_reasons_follow_vllm() -> None:
    assert finished_reason(done_request(4, 4, 0.1, 0.4)) == "length"
    assert finished_reason(done_request(2, 4, 0.1, 0.4)) == "stop"  # ended early on a stop token
    cancelled = done_request(0, 4, 0.0, 0.0)
    cancelled.status = RequestStatus.CANCELLED
    assert finished_reason(cancelled) == "abort"


def test_inter_token_latency_is_the_mean_gap_counted_once_per_gap() -> None:
    assert inter_token_s(done_request(1, 1, 0.1, 0.1)) is None  # one token: no gap
    assert inter_token_s(done_request(5, 5, 0.2, 1.0)) == 0.2
    state, _ = make_state()
    metrics = LiveMetrics(state)
    metrics.request_ended(done_request(5, 5, 0.2, 1.0))
    labels = {"model_name": "m", "tenant": "a"}
    assert value(metrics, "slicesched:inter_token_latency_seconds_count", **labels) == 4
    assert value(metrics, "slicesched:inter_token_latency_seconds_sum", **labels) == 0.8
    assert value(metrics, "slicesched:inter_token_latency_seconds_bucket", le="0.15", **labels) == 0
    assert value(metrics, "slicesched:inter_token_latency_seconds_bucket", le="0.2", **labels) == 4  # le: inclusive
    assert value(metrics, "slicesched:generation_tokens_total", **labels) == 5
    assert value(metrics, "slicesched:prompt_tokens_total", **labels) == 3
    assert value(metrics, "slicesched:sla_violations_total", **labels) == 0  # 0.2 s between tokens: standard's limit


def test_token_histogram_matches_prometheus_client_bucket_edges() -> None:
    h = TokenHistogram("x_seconds", "x", ("l",), ITL_BUCKETS)
    for v in (0.0, 0.01, 0.010001, 80.0, 81.0):
        h.observe(("a",), v, 2)
    [family] = h.collect()
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name == "x_seconds_bucket"}
    assert buckets["0.01"] == 4 and buckets["0.025"] == 6 and buckets["80.0"] == 8 and buckets["+Inf"] == 10
    [total] = [s.value for s in family.samples if s.name == "x_seconds_sum"]
    assert total == pytest.approx(2 * (0.01 + 0.010001 + 80.0 + 81.0))


def test_kv_usage_is_leased_kv_over_the_reserve_and_capped_at_one() -> None:
    state, _ = make_state(kv_reserve_tokens=100)
    metrics = LiveMetrics(state)
    submit(state, "a", 2, max_tokens=3)  # prompts of 2 tokens: 5 tokens of KV each
    state.grant("e1", 8)
    assert value(metrics, "slicesched:kv_cache_usage_perc", model_name="m", tenant="a") == 10 / 100
    assert value(metrics, "slicesched:kv_cache_usage_perc", model_name="m", tenant="b") == 0.0
    submit(state, "a", 6, max_tokens=40)
    state.grant("e1", 8)
    assert value(metrics, "slicesched:kv_cache_usage_perc", model_name="m", tenant="a") == 1.0
    assert value(metrics, "slicesched:num_requests_running", model_name="m", tenant="a") == 8


def test_a_replica_cut_over_devices_plans_and_runs_a_slice_per_device() -> None:
    state, _ = make_state()
    state.register_executor("e3", "h", [("cpu:0", "cpu", 2 << 30), ("cpu:1", "cpu", 2 << 30)])
    metrics = LiveMetrics(state)
    staged = state.add_replica("b/m", ("e3/cpu:0", "e3/cpu:1"), guest=True)
    metrics.placed("replica", "add", [staged])
    assert value(metrics, "slicesched:placements_applied_total", policy="replica", action="add", kind="slice") == 1
    assert value(metrics, "slicesched:slices_planned", model_name="m", tenant="b") == 1 + 2
    submit(state, "b", 1)
    [(_, replica, _)] = state.grant("e3", 8)
    assert replica.replica_id == staged.replica_id
    assert value(metrics, "slicesched:slices_running", model_name="m", tenant="b") == 2
    staged.draining = True
    assert value(metrics, "slicesched:slices_planned", model_name="m", tenant="b") == 1

