"""Slices cut from operator graphs in memory (service/core/cut.py): coverage, contiguity,
dependencies, weights and FLOPs of every cut, the attention/MLP rule, sizes, and refusals."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from service.core.cut import Granularity, SliceCut, cut_graph
from service.domain.error import InvalidGraphError, InvalidInputError
from service.domain.model_config import model_config
from service.domain.opgraph import OperatorGraph
from service.models.cut import cut_model
from service.models.trace import trace_phase

MODELS = ("tiny", "tiny-llama")
GRANULARITIES = (Granularity(1), Granularity(2), Granularity(3), Granularity(6), Granularity(1, sublayer=True))


@cache
def graph(name: str, phase: str, n_layers: int = 6) -> OperatorGraph:
    return trace_phase(model_config(name, n_layers=n_layers), phase, batch=2, tokens=8, context=8)


def slice_of(cut: list[SliceCut]) -> dict[str, int]:
    return {op: s.index for s in cut for op in s.op_ids}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
def test_a_cut_covers_every_operator_once_in_contiguous_slices(name: str, phase: str, granularity: Granularity) -> None:
    g = graph(name, phase)
    cut = cut_graph(g, granularity)
    assert [s.index for s in cut] == list(range(granularity.num_slices(6)))
    # every operator exactly once, slices one after another in index order
    assert [op for s in cut for op in s.op_ids] == [op.op_id for op in g.operators]
    # predecessors: exactly the slices holding a producer of an operator across a PRECEDES edge
    where = slice_of(cut)
    crossing = {(where[a], where[b]) for a, b in g.edges() if where[a] != where[b]}
    assert crossing == {(p, s.index) for s in cut for p in s.predecessors}
    assert all(p < s.index for s in cut for p in s.predecessors)
    # weights: every weight is read by the slices listing it, and only those
    reads = {(where[op.op_id], t) for op in g.operators for t in op.inputs if g.tensors[t].kind == "weight"}
    assert reads == {(s.index, w) for s in cut for w in s.weight_ids}
    assert {w for s in cut for w in s.weight_ids} == {t for t, x in g.tensors.items() if x.kind == "weight"}
    assert all(s.weight_bytes == sum(g.tensors[w].size_bytes for w in s.weight_ids) for s in cut)
    assert sum(s.flops for s in cut) == g.total_flops
    assert max(s.workspace_bytes for s in cut) == max(op.workspace_bytes for op in g.operators)
    assert all(s.tokens == g.num_tokens == 2 * (8 if phase == "prefill" else 1) for s in cut)
    # each tensor crossing a boundary is an output of its producer's slice and an input of its readers'
    for s in cut:
        if s.index > 0:
            assert s.input_bytes > 0 and s.predecessors
        if s.index < len(cut) - 1:
            assert s.output_bytes > 0


@pytest.mark.parametrize("name", MODELS)
def test_weights_partition_the_model_except_tied_ones(name: str) -> None:
    g = graph(name, "decode")
    cut = cut_graph(g, Granularity(2))
    tied = {"w:embed.weight"} if name == "tiny" else set()  # GPT-2's LM head is its embedding
    listed = [w for s in cut for w in s.weight_ids]
    assert sorted(w for w in listed if w not in tied) == sorted(set(listed) - tied)
    assert [w for w in tied if listed.count(w) == 2] == sorted(tied)
    extra = sum(g.tensors[w].size_bytes for w in tied)
    assert sum(s.weight_bytes for s in cut) == g.bytes_of("weight") + extra


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_layer_cuts_name_their_layers_and_outer_operators_join_the_ends(name: str, phase: str) -> None:
    g = graph(name, phase)
    cut = cut_graph(g, Granularity(2))
    assert [(s.first_layer, s.last_layer, s.part) for s in cut] == [(0, 1, "layers"), (2, 3, "layers"), (4, 5, "layers")]
    layer = {op.op_id: op.layer for op in g.operators}
    assert all(layer[op] in (-1, 0, 1) for op in cut[0].op_ids)
    assert all(layer[op] in (2, 3) for op in cut[1].op_ids)
    assert all(layer[op] in (4, 5, -1) for op in cut[2].op_ids)
    assert layer[cut[0].op_ids[0]] == -1 and layer[cut[2].op_ids[-1]] == -1  # embedding, then the LM head
    assert any("lm_head" in op for op in cut[2].op_ids)
    # one slice of every layer is the whole graph
    (whole,) = cut_graph(g, Granularity(6))
    assert whole.predecessors == () and whole.input_bytes == sum(
        t.size_bytes for t in g.tensors.values() if t.kind == "input")


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_sublayer_cut_splits_each_layer_at_its_second_norm(name: str, phase: str) -> None:
    g = graph(name, phase)
    cut = cut_graph(g, Granularity(1, sublayer=True))
    assert [(s.first_layer, s.part) for s in cut] == [(layer, part) for layer in range(6) for part in ("attention", "mlp")]
    ops = {op.op_id: op for op in g.operators}
    for s in cut:
        inner = [ops[o] for o in s.op_ids if ops[o].layer >= 0]
        assert {op.layer for op in inner} == {s.first_layer}
        assert inner[0].kind == "norm"
        kinds = {op.kind for op in inner}
        names = {w.split(".")[2] for w in s.weight_ids if w.startswith("w:blocks.")}
        if s.part == "attention":
            assert "attention" in kinds and names == {"attn_norm", "attn"}
            assert inner[-1].target == "add"  # the residual add after the output projection
        else:
            assert "attention" not in kinds and names == {"mlp_norm", "mlp"}
    # the MLP part reads the residual stream (its input) and no KV; in decode the attention part
    # reads its layer's share of the one cache tensor
    d = g.config["d_model"]
    residual = g.num_tokens * d * 4
    assert all(s.input_bytes == residual and s.kv_bytes == 0 for s in cut[1:-1:2])
    if phase == "decode":
        cache_bytes = next(t.size_bytes for t in g.tensors.values() if t.kind == "kv_cache" and t.tensor_id.startswith("kv:"))
        assert all(s.kv_bytes == cache_bytes // 6 for s in cut[0:-1:2])


def test_boundary_bytes_and_kv_of_a_gpt2_layer() -> None:
    """tiny (GPT-2 style, d=192, 4 heads of 48) at batch 2 x 8 tokens, float32."""
    g = graph("tiny", "prefill")
    cut = cut_graph(g, Granularity(1))
    residual = 2 * 8 * 192 * 4
    layer_kv = 2 * 2 * 4 * 8 * 48 * 4  # [k|v, B, H, T, Dh], read by the tail's stack of every layer
    middle = cut[2]
    assert (middle.input_bytes, middle.output_bytes, middle.kv_bytes) == (residual, residual + layer_kv, 0)
    assert cut[0].input_bytes == 2 * 2 * 8 * 8  # token ids and positions, int64
    last = cut[-1]
    logits = 2 * 8 * 256 * 4
    assert last.input_bytes == residual + 5 * layer_kv and last.output_bytes == logits
    assert last.kv_bytes == 6 * layer_kv  # the stacked cache, written by the tail
    assert last.predecessors == (0, 1, 2, 3, 4)
    # activation bytes scale with the batch's tokens; rounding up
    assert middle.bytes_for(middle.tokens * 3) == (3 * middle.input_bytes, 3 * middle.output_bytes)
    assert middle.bytes_for(1) == (residual // 16, (residual + layer_kv) // 16)
    with pytest.raises(InvalidInputError, match="tokens must be an integer >= 1"):
        middle.bytes_for(0)


@pytest.mark.parametrize(("granularity", "message"), [
    (lambda: Granularity(4), "granularity of 4 layers does not divide tiny's 6 layers"),
    (lambda: Granularity(12), "granularity of 12 layers does not divide tiny's 6 layers"),
    (lambda: Granularity(0), "layers per slice must be an integer >= 1, got 0"),
    (lambda: Granularity(-2), "layers per slice must be an integer >= 1"),
    (lambda: Granularity(1.5), "layers per slice must be an integer >= 1"),  # type: ignore[arg-type]
    (lambda: Granularity(2, sublayer=True), "needs layers=1, got layers=2"),
])
def test_a_bad_granularity_is_refused_with_a_clear_message(granularity: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        cut_graph(graph("tiny", "decode"), granularity())  # type: ignore[operator]


def test_a_layer_without_a_second_norm_cannot_be_cut_into_attention_and_mlp() -> None:
    g = graph("tiny-llama", "decode", 2)
    ops = [dataclasses.replace(op, kind="elementwise") if op.op_id.endswith("blocks_1_mlp_norm") else op
           for op in g.operators]
    broken = dataclasses.replace(g, operators=ops)
    with pytest.raises(InvalidGraphError, match="layer 1's mlp part has no operators"):
        cut_graph(broken, Granularity(1, sublayer=True))
    assert len(cut_graph(broken, Granularity(1))) == 2  # whole layers still cut


def test_a_slice_interleaved_with_another_is_refused() -> None:
    g = graph("tiny", "decode", 2)
    ops = [dataclasses.replace(op, layer=0) if op.op_id.endswith("blocks_1_mlp_norm") else op for op in g.operators]
    with pytest.raises(InvalidGraphError, match="layers 0-0 is not contiguous"):
        cut_graph(dataclasses.replace(g, operators=ops), Granularity(1))


@pytest.mark.slow
def test_cut_model_is_cached_and_cuts_llama2_70b_on_the_meta_device() -> None:
    c = model_config("llama2-70b")
    with pytest.raises(InvalidInputError, match="granularity of 3 layers does not divide llama2-70b's 80 layers"):
        cut_model(c, "decode", Granularity(3))
    with pytest.raises(InvalidInputError, match="unknown phase"):
        cut_model(c, "train", Granularity(8))
    cut = cut_model(c, "decode", Granularity(8))
    assert cut_model(c, "decode", Granularity(8)) is cut
    assert len(cut) == 10 and cut[0].tokens == 1
    # bfloat16 weights, listed once each (Llama does not tie), the rotary buffer besides
    assert sum(s.weight_bytes for s in cut) == 2 * c.num_params() + c.head_dim // 2 * 2
    # one decode step reads the 80-layer cache of 512 tokens: [80, 2, 1, 8 kv heads, 512, 128]
    cache_bytes = 80 * 2 * 8 * 512 * 128 * 2
    assert all(s.kv_bytes >= cache_bytes // 10 for s in cut) and sum(s.kv_bytes for s in cut) < cache_bytes * 1.01
