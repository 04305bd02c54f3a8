"""Analytic iteration cost: FLOPs agree with the traced graphs, memoisation, sizes."""

from __future__ import annotations

import pytest

from service.cluster.spec import load_cluster_spec
from service.domain.model_config import MODEL_CONFIGS
from service.models.trace import trace_phase
from service.sim.analytic import RooflineLike
from service.sim.iteration import (
    BatchFeatures,
    IterationCostTable,
    bucket,
    iteration_ops,
    kv_bytes_per_token,
    weight_bytes,
)


@pytest.mark.parametrize("name", ["tiny", "tiny-llama", "gpt2-small"])
@pytest.mark.parametrize(("phase", "batch", "size"), [("prefill", 2, 24), ("decode", 3, 37)])
def test_analytic_flops_match_the_traced_graph(name: str, phase: str, batch: int, size: int) -> None:
    config = MODEL_CONFIGS[name]
    if phase == "prefill":
        graph = trace_phase(config, phase, batch=batch, tokens=size)
        feats = BatchFeatures.of([(size, 0)] * batch, [], all_logits=True)
    else:
        graph = trace_phase(config, phase, batch=batch, context=size)
        feats = BatchFeatures.of([], [size] * batch, all_logits=True)
    ops = iteration_ops(config, feats)
    assert sum(op.flops for op in ops) == pytest.approx(graph.total_flops, rel=0.01)
    traced_kinds = {op.kind for op in graph.operators} - {"memory", "creation"}
    assert {op.kind for op in ops} == traced_kinds


def test_weight_and_kv_sizes_match_the_traced_graph() -> None:
    for name in ("tiny", "tiny-llama"):
        config = MODEL_CONFIGS[name]
        graph = trace_phase(config, "prefill", batch=1, tokens=10)
        # the traced llama graph also holds the rotary inverse frequencies (a buffer, not a weight)
        buffers = config.head_dim // 2 * 4 if config.style == "llama" else 0
        assert weight_bytes(config) + buffers == graph.bytes_of("weight")
        assert kv_bytes_per_token(config) * 10 == graph.bytes_of("kv_cache")


def test_a_mixed_batch_counts_each_part_once() -> None:
    config = MODEL_CONFIGS["tiny"]
    mixed = BatchFeatures.of([(16, 8)], [5, 9])
    assert (mixed.num_tokens, mixed.prefill_pairs, mixed.prefill_kv_tokens, mixed.decode_context_sum,
            mixed.logits_rows) == (18, 16 * 24, 24, 14, 3)
    attn = [op for op in iteration_ops(config, mixed) if op.kind == "attention"]
    per_layer = 4 * config.n_heads * config.head_dim * (16 * 24 + (5 + 1) + (9 + 1))
    assert sum(op.flops for op in attn) == per_layer * config.n_layers


def test_bucket_rounds_up_by_at_most_one_sixteenth() -> None:
    for x in [*range(1, 200), 1000, 4097, 65_537, 10**6 + 3]:
        b = bucket(x)
        assert x <= b <= x * (1 + 1 / 16)
        assert bucket(b) == b
    assert bucket(32) == 32 and bucket(33) == 34


def test_the_table_memoises_on_bucketed_features() -> None:
    device = load_cluster_spec("8xA100-nvlink").devices[0]
    table = IterationCostTable(MODEL_CONFIGS["llama2-7b"], RooflineLike(), device)
    a = table.latency_s(0, 0, 0, 0, 8, 4000)
    b = table.latency_s(0, 0, 0, 0, 8, 4001)  # same bucket
    assert a == b and (table.num_queries, table.num_misses) == (2, 1)
    exact = table.exact_s(BatchFeatures(0, 0, 0, 0, 8, 4000, logits_rows=8))
    assert exact <= a <= exact * 1.07
    # a llama2-7b decode step is memory bound: ~13.5 GB of weights at 80 % of 2 TB/s
    assert 0.007 < a < 0.012
