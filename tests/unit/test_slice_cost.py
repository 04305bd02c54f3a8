"""Slice latency from the operator subgraph: edges, predict_graph / predict_slice, traced slices and their times."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from learned.artifact import ArtifactCostModel
from learned.calibration import conformal_shift, group_folds
from learned.evaluate import score_slices
from learned.gnn import GnnConfig, GnnCostModel, GraphSample, train_gnn
from learned.profile import LAYER_CHAIN, VIDUR_OP_KINDS, OpTiming
from learned.roofline import RooflineCostModel, device_of_kind
from learned.slices import SLICE_KINDS, TimedSlice, layer_roles, timed_slices, vidur_configs
from service.core.cost import (
    NO_OVERHEAD,
    GraphCostModel,
    chain_edges,
    check_edges,
    predict_slice,
    slice_of,
)
from service.domain.error import InvalidInputError
from service.domain.model_config import model_config
from service.domain.opgraph import OperatorGraph
from service.models.trace import trace_phase
from tests.conftest import data_path, needs_data

torch.set_num_threads(1)

A100 = device_of_kind("A100-80GB")
CONFIG = model_config("tiny-llama", n_layers=3)


@pytest.fixture(scope="module")
def graph() -> OperatorGraph:
    return trace_phase(CONFIG, "prefill", batch=1, tokens=16)


def _layer_ids(graph: OperatorGraph, layer: int) -> list[str]:
    return [op.op_id for op in graph.operators if op.layer == layer]


@pytest.fixture(scope="module")
def gnn(graph: OperatorGraph) -> GnnCostModel:
    """A tiny net trained for two epochs on slices of the traced graph, with their real edges."""
    samples = []
    for layer in range(3):
        ops, edges = slice_of(graph, _layer_ids(graph, layer))
        for scale in (0.5, 1.0, 2.0):
            samples.append(GraphSample(tuple(ops), A100, scale * len(ops) * 0.01, edges=tuple(edges)))
    model, _ = train_gnn(samples, GnnConfig(epochs=2, hidden=8, batch_graphs=4))
    return model


# -- edges ---------------------------------------------------------------------------------------

def test_check_edges_canonicalises_direction_and_repeats() -> None:
    assert check_edges(4, [(2, 1), (1, 2), (0, 3), (0, 1)]) == ((0, 1), (0, 3), (1, 2))
    assert check_edges(3, []) == ()
    assert chain_edges(4) == ((0, 1), (1, 2), (2, 3))


@pytest.mark.parametrize("edges, why", [
    ([(0, 3)], "positions must be in 0..2"),
    ([(-1, 0)], "positions must be in 0..2"),
    ([(1, 1)], "cannot feed itself"),
    ([(0, 1.0)], "pair of operator positions"),
    ([(True, 1)], "pair of operator positions"),
    ([(0, 1, 2)], "pair of operator positions"),
])
def test_bad_edges_are_invalid_input(edges: list[tuple[int, int]], why: str) -> None:
    with pytest.raises(InvalidInputError, match=why):
        check_edges(3, edges)


# -- slices of a traced graph ------------------------------------------------------------------

def test_slice_of_a_layer_has_its_real_residual_edges(graph: OperatorGraph) -> None:
    ids = _layer_ids(graph, 1)
    ops, edges = slice_of(graph, list(reversed(ids)))  # any order in; the graph's order out
    assert len(ops) == len(ids) and ops[0].kind == "norm"
    assert all(0 <= a < b < len(ops) for a, b in edges)  # topological positions
    assert any(b > a + 1 for a, b in edges)  # not a chain: a residual or a fan-out
    assert set(chain_edges(len(ops))) != set(edges)
    # edges to operators outside the slice (the layer's input, the rotary angles) are left out
    full = {(a, b) for a, b in graph.edges()}
    index = {o: i for i, o in enumerate(ids)}
    assert {(ids[a], ids[b]) for a, b in edges} == {(a, b) for a, b in full if a in index and b in index}


def test_slice_of_bad_ids_are_invalid_input(graph: OperatorGraph) -> None:
    with pytest.raises(InvalidInputError, match="not in the graph"):
        slice_of(graph, ["op99999_nowhere"])
    first = graph.operators[0].op_id
    with pytest.raises(InvalidInputError, match="named twice"):
        slice_of(graph, [first, first])
    with pytest.raises(InvalidInputError, match="empty slice"):
        slice_of(graph, [])


# -- the GNN on graphs -----------------------------------------------------------------------------

def test_chain_edges_give_exactly_predict(gnn: GnnCostModel, graph: OperatorGraph) -> None:
    ops, _ = slice_of(graph, _layer_ids(graph, 1))
    chain = gnn.predict(ops, A100)
    assert gnn.predict_graph(ops, list(chain_edges(len(ops))), A100) == chain
    assert gnn.predict_graph(ops, [(b, a) for a, b in reversed(chain_edges(len(ops)))], A100) == chain
    assert isinstance(gnn, GraphCostModel)


def test_edges_change_the_prediction_consistently(gnn: GnnCostModel, graph: OperatorGraph) -> None:
    ops, edges = slice_of(graph, _layer_ids(graph, 1))
    real = gnn.predict_graph(ops, edges, A100)
    assert real.p50_s != pytest.approx(gnn.predict(ops, A100).p50_s, rel=1e-6)  # the residuals count
    assert 0 < real.p50_s <= real.p90_s <= real.p99_s
    # direction and repeats do not matter (messages pass both ways)
    assert gnn.predict_graph(ops, [(b, a) for a, b in edges] + edges, A100) == real
    # relabelling the operators (and the edges with them) leaves the answer unchanged
    perm = np.random.default_rng(0).permutation(len(ops))
    where = {int(old): new for new, old in enumerate(perm)}
    moved = gnn.predict_graph([ops[int(i)] for i in perm], [(where[a], where[b]) for a, b in edges], A100)
    assert moved.p50_s == pytest.approx(real.p50_s, rel=1e-5)
    assert moved.p90_s == pytest.approx(real.p90_s, rel=1e-5)
    # a memoised answer equals a fresh one
    assert GnnCostModel(gnn._net, gnn.config, gnn._mean, gnn._std).predict_graph(ops, edges, A100) == real


def test_gnn_bad_edges_are_invalid_input(gnn: GnnCostModel, graph: OperatorGraph) -> None:
    ops, edges = slice_of(graph, _layer_ids(graph, 1))
    with pytest.raises(InvalidInputError, match="positions must be in"):
        gnn.predict_graph(ops, [*edges, (0, len(ops))], A100)
    with pytest.raises(InvalidInputError, match="positions must be in"):
        predict_slice(gnn, ops, [(-1, 0)], A100)


def test_predict_slice_sums_operators_for_models_without_graphs(gnn: GnnCostModel, graph: OperatorGraph) -> None:
    ops, edges = slice_of(graph, _layer_ids(graph, 0))
    roofline = RooflineCostModel()
    assert not isinstance(roofline, GraphCostModel)
    assert predict_slice(roofline, ops, edges, A100) == roofline.predict(ops, A100)
    with pytest.raises(InvalidInputError, match="positions must be in"):
        predict_slice(roofline, ops, [(0, len(ops) + 3)], A100)
    assert predict_slice(gnn, ops, edges, A100) == gnn.predict_graph(ops, edges, A100)
    # the artifact model answers with the model it chose for the device kind
    both = ArtifactCostModel({"gnn": gnn, "roofline": roofline}, {"A100-80GB": "gnn"}, "roofline",
                             {"A100-80GB": NO_OVERHEAD}, name="learned")
    assert both.predict_graph(ops, edges, A100) == gnn.predict_graph(ops, edges, A100)
    h100 = device_of_kind("H100-80GB")
    assert both.predict_graph(ops, edges, h100) == roofline.predict(ops, h100)
    # slices follow their own per-kind choice (from slice evidence), iterations theirs
    split = ArtifactCostModel({"gnn": gnn, "roofline": roofline}, {"A100-80GB": "roofline"}, "roofline",
                              {}, name="learned", graph_choice={"A100-80GB": "gnn"})
    assert split.predict(ops, A100) == roofline.predict(ops, A100)
    assert split.predict_graph(ops, edges, A100) == gnn.predict_graph(ops, edges, A100)


def test_uncounted_operators_pass_messages_but_add_no_time(gnn: GnnCostModel, graph: OperatorGraph) -> None:
    ops, edges = slice_of(graph, _layer_ids(graph, 1))
    counted = tuple(op.kind != "attention" for op in ops)
    full = GraphSample(tuple(ops), A100, 1.0, edges=tuple(edges))
    part, every = gnn.predict_samples([replace(full, counted=counted), full])
    # predict_graph answers from bucketed features (within 1/128 octave), predict_samples from exact ones
    assert every.p50_s == pytest.approx(gnn.predict_graph(ops, edges, A100).p50_s, rel=1e-2)
    assert part.p50_s < every.p50_s


# -- slices timed by profile rows ---------------------------------------------------------------------

def _rows(model: str, tokens: int, ms: dict[str, float]) -> list[OpTiming]:
    return [OpTiming("A100-80GB", model, op, VIDUR_OP_KINDS[op], tokens, 1, 1, 0, 1, 1, ms[op], ms[op], 0.0, ms[op],
                     ms[op]) for op in LAYER_CHAIN]


def test_layer_roles_map_every_traced_operator(graph: OperatorGraph) -> None:
    ops = [op for op in graph.operators if op.layer == 1]
    roles = layer_roles(ops)
    untimed = [op.target for op, (_, role) in zip(ops, roles, strict=True) if role is None]
    assert sorted(untimed) == ["scaled_dot_product_attention", "stack"]
    timed = {role for _, role in roles if role is not None}
    assert timed == set(LAYER_CHAIN)
    with pytest.raises(ValueError, match="llama-style"):
        layer_roles(ops[:5])


def test_slice_times_are_the_vidur_operators_they_cover() -> None:
    ms = {op: float(i + 1) for i, op in enumerate(LAYER_CHAIN)}  # distinct, so every sum is telling
    slices = timed_slices(_rows("m", 16, ms) + _rows("m", 32, ms), {"m": CONFIG})
    assert len(slices) == 2 * len(SLICE_KINDS)
    by_kind = {s.kind: s.sample for s in slices if s.tokens == 16}
    attn = math.fsum(ms[o] for o in ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "add"))
    mlp = math.fsum(ms[o] for o in ("post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"))
    expected = {"attention": attn, "mlp": mlp, "layer": attn + mlp, "mlp+attention": attn + mlp,
                "2 layers": 2 * (attn + mlp), "3 layers": 3 * (attn + mlp)}
    attention_parts = {"attention": 1, "mlp": 0, "layer": 1, "mlp+attention": 1, "2 layers": 2, "3 layers": 3}
    for kind, sample in by_kind.items():
        assert sample.target_ms == pytest.approx(expected[kind])
        assert sample.counted is not None and sample.op_targets_ms is not None and sample.edges is not None
        known = [t for t in sample.op_targets_ms if not math.isnan(t)]
        assert math.fsum(known) < sample.target_ms  # fused kernels are known only as a whole
        # the attention kernel and the KV write of each attention part are context only
        assert sum(not c for c in sample.counted) == 2 * attention_parts[kind]
    # a model without a config, a TP-2 row or an incomplete layer makes no slice
    assert timed_slices(_rows("other", 16, ms), {"m": CONFIG}) == []
    assert timed_slices([replace(t, tp=2) for t in _rows("m", 16, ms)], {"m": CONFIG}) == []
    assert timed_slices(_rows("m", 16, ms)[:-1], {"m": CONFIG}) == []
    fewer = timed_slices(_rows("m", 16, ms) + _rows("m", 32, ms) + _rows("m", 64, ms), {"m": CONFIG},
                         tokens_per_model=2)
    assert sorted({s.tokens for s in fewer}) == [16, 64]


def test_score_slices_reports_every_kind(gnn: GnnCostModel) -> None:
    ms = {op: 0.05 for op in LAYER_CHAIN}
    slices: list[TimedSlice] = timed_slices(_rows("m", 16, ms), {"m": CONFIG})
    for model in (gnn, RooflineCostModel()):
        got = score_slices(model, slices)
        assert got["n"] == len(SLICE_KINDS) and set(got["by_kind_mape_pct"]) == set(SLICE_KINDS)
        assert math.isfinite(got["mape_pct"]) and 0.0 <= got["p90_coverage"] <= 1.0


@needs_data("vidur-profiling")
def test_vidur_configs_are_the_gated_profiled_shapes() -> None:
    configs = vidur_configs(data_path("vidur-profiling/profiling/compute"))
    assert "phi-2" not in configs  # not gated: not a llama-style layer
    internlm, qwen = configs["internlm-20b"], configs["Qwen-72B"]
    assert (internlm.d_model, internlm.n_heads, internlm.n_kv_heads, internlm.d_ff) == (5120, 40, 40, 13824)
    assert (qwen.d_model, qwen.n_kv_heads, qwen.d_ff) == (8192, 64, 24576)
    assert configs["Llama-2-70b-hf"].n_kv_heads == 8 and configs["Meta-Llama-3-8B"].style == "llama"


# -- conformal quantiles ---------------------------------------------------------------------------

def test_conformal_shift_makes_the_p90_cover_its_calibration_set(gnn: GnnCostModel, graph: OperatorGraph,
                                                                 tmp_path: Path) -> None:
    ops, edges = slice_of(graph, _layer_ids(graph, 2))
    rng = np.random.default_rng(0)
    samples = [GraphSample(tuple(ops), A100, float(ms), edges=tuple(edges)) for ms in rng.lognormal(-2, 1, 40)]
    assert conformal_shift(gnn, []) == (0.0, 0.0)
    shift = conformal_shift(gnn, samples)
    shifted = gnn.with_quantile_shift(shift)
    before, after = gnn.predict_samples(samples), shifted.predict_samples(samples)
    obs = np.asarray([s.target_ms / 1e3 for s in samples])
    assert np.mean(obs <= np.asarray([p.p90_s for p in after])) >= 0.9
    assert np.mean(obs <= np.asarray([p.p99_s for p in after])) >= 0.99
    for a, b in zip(before, after, strict=True):
        assert b.p50_s == a.p50_s and b.p50_s <= b.p90_s <= b.p99_s
    assert shifted.predict(ops, A100) == gnn.predict(ops, A100)  # a chain keeps the trained quantiles
    loaded = GnnCostModel.load(shifted.save(tmp_path / "gnn"))
    assert loaded.quantile_shift == shifted.quantile_shift


def test_group_folds_hold_out_every_group_once() -> None:
    rows = [t for m in ("a", "b", "c", "d", "e") for t in _rows(m, 16, {op: 1.0 for op in LAYER_CHAIN})]
    folds = group_folds(rows, "model", {"a", "b", "c", "d", "x"}, seed=0)  # "e" is not a group; "x" is absent
    assert len(folds) == 2
    held = [{t.model for t in cal} for _, cal in folds]
    assert sorted(m for h in held for m in h) == ["a", "b", "c", "d"]
    for fit, cal in folds:
        assert not {t.model for t in fit} & {t.model for t in cal} and len(fit) + len(cal) == len(rows)
    assert group_folds(rows, "device_kind", {"A100-80GB"}, seed=0) == []  # a single group
