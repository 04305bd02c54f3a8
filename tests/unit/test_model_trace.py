"""Tracing the built-in model family into operator graphs (torch.fx and the torch.compile backend)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from service.domain.model_config import MODEL_CONFIGS, ModelConfig, model_config
from service.domain.opgraph import OperatorGraph
from service.models.family import build_model, example_inputs
from service.models.trace import GraphRecorder, trace_phase

MATMUL_KINDS = ("linear", "matmul", "attention")
# Operators per model: a fixed head/tail plus a fixed count per layer (decode adds two cache concats).
OPS = {"gpt2": {"prefill": (6, 11), "decode": (6, 13)}, "llama": {"prefill": (11, 25), "decode": (11, 27)}}


def analytic_matmul_flops(c: ModelConfig, phase: str, batch: int, tokens: int, context: int) -> int:
    """2 x rows x (weights of every projection) + 4 x B x H x Tq x Tk x Dh for attention (+ biases)."""
    d, f, v, kv = c.d_model, c.d_ff, c.vocab_size, c.n_kv_heads * c.head_dim
    tq = tokens if phase == "prefill" else 1
    tk = tokens if phase == "prefill" else context + 1
    rows = batch * tq
    if c.style == "gpt2":
        weights = c.n_layers * (3 * d * d + d * d + 2 * d * f) + d * v
        biases = c.n_layers * (3 * d + d + f + d)
    else:
        weights = c.n_layers * (2 * d * d + 2 * d * kv + 3 * d * f) + d * v
        biases = 0
    attention = c.n_layers * 4 * batch * c.n_heads * tq * tk * c.head_dim
    return 2 * rows * weights + rows * biases + attention


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODEL_CONFIGS))
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_every_builtin_model_traces_with_expected_operators_and_flops(name: str, phase: str) -> None:
    c = model_config(name)
    batch, tokens, context = 2, 64, 128
    g = trace_phase(c, phase, batch=batch, tokens=tokens, context=context)
    head, per_layer = OPS[c.style][phase]
    assert len(g.operators) == head + per_layer * c.n_layers
    assert sum(op.kind == "attention" for op in g.operators) == c.n_layers
    traced = sum(op.flops for op in g.operators if op.kind in MATMUL_KINDS)
    expected = analytic_matmul_flops(c, phase, batch, tokens, context)
    assert abs(traced - expected) / expected < 0.01
    # Weights are counted once (GPT-2 ties lm_head to the embedding), in the model's dtype.
    itemsize = torch.tensor([], dtype=getattr(torch, c.dtype)).element_size()
    buffers = c.head_dim // 2 * itemsize if c.style == "llama" else 0
    assert g.bytes_of("weight") == c.num_params() * itemsize + buffers
    kv_tensors = [t for t in g.tensors.values() if t.kind == "kv_cache"]
    new_positions = tokens if phase == "prefill" else 1
    assert any(t.shape == (c.n_layers, 2, batch, c.n_kv_heads, new_positions, c.head_dim) for t in kv_tensors)


def test_flops_agree_with_torch_flop_counter_on_a_real_run() -> None:
    c = model_config("tiny")
    model = build_model(c, seed=0)
    inputs = example_inputs(c, "prefill", batch=2, tokens=32)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model(**inputs)
    g = trace_phase(c, "prefill", batch=2, tokens=32)
    ours = sum(op.flops for op in g.operators if op.kind in MATMUL_KINDS)
    biases = 2 * 32 * c.n_layers * (3 * c.d_model + c.d_model + c.d_ff + c.d_model)
    assert ours - biases == counter.get_total_flops()


def test_graph_is_a_valid_dag_with_layers_and_dependencies() -> None:
    g = trace_phase(model_config("tiny-llama"), "prefill", batch=1, tokens=16)
    assert g.validate() is g
    index = {op.op_id: op.index for op in g.operators}
    assert all(index[a] < index[b] for a, b in g.edges())
    assert {op.layer for op in g.operators} == {-1, 0, 1}
    assert all(op.flops >= 0 and op.bytes_written > 0 for op in g.operators)


def test_same_seed_gives_identical_weights_and_outputs() -> None:
    c = model_config("tiny-llama")
    a, b = build_model(c, seed=3), build_model(c, seed=3)
    other = build_model(c, seed=4)
    x = example_inputs(c, "prefill", batch=1, tokens=8)
    with torch.inference_mode():
        assert torch.equal(a(**x)[0], b(**x)[0])
        assert not torch.equal(a(**x)[0], other(**x)[0])


def test_decode_with_cache_equals_prefill_of_the_longer_sequence() -> None:
    model = build_model(model_config("tiny"), seed=1)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9).expand(2, 9)
    with torch.inference_mode():
        full, _ = model(ids, pos)
        _, kv = model(ids[:, :8], pos[:, :8])
        step, _ = model(ids[:, 8:], pos[:, 8:], kv_cache=kv)
    assert torch.allclose(full[:, 8], step[:, 0], atol=1e-5)


@pytest.mark.slow
def test_compile_backend_runs_the_model_and_records_the_same_graph() -> None:
    c = model_config("tiny-llama")
    model = build_model(c, seed=2)
    inputs = example_inputs(c, "prefill", batch=1, tokens=16)
    recorder = GraphRecorder(model_name=c.name, phase="prefill", shape={"batch": 1, "tokens": 16})
    compiled = torch.compile(model, backend=recorder, dynamic=False)
    with torch.inference_mode():
        got, _ = compiled(**inputs)
        want, _ = model(**inputs)
    torch._dynamo.reset()
    assert torch.allclose(got, want, atol=1e-6)
    assert len(recorder.graphs) == 1
    recorded = recorder.graphs[0]
    traced = trace_phase(c, "prefill", batch=1, tokens=16)
    assert recorded.validate() is recorded
    kinds = ("linear", "attention")
    assert sorted(op.flops for op in recorded.operators if op.kind in kinds) == \
        sorted(op.flops for op in traced.operators if op.kind in kinds)
    assert recorded.bytes_of("weight") == traced.bytes_of("weight")


def test_graph_document_round_trips() -> None:
    g = trace_phase(model_config("tiny"), "decode", batch=2, context=32)
    back = OperatorGraph.from_dict(g.to_dict())
    assert back.to_dict() == g.to_dict()
    assert back.edges() == g.edges()


def test_shape_only_models_refuse_to_materialise() -> None:
    with pytest.raises(ValueError, match="shape-only"):
        build_model(model_config("llama2-70b"), device="cpu")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"phase": "train"}, "unknown phase"),
    ({"phase": "prefill", "tokens": 0}, "tokens must be"),
    ({"phase": "prefill", "tokens": 100_000}, "tokens must be"),
    ({"phase": "decode", "context": 0}, "context must be"),
    ({"phase": "prefill", "batch": 0}, "batch must be"),
])
def test_bad_trace_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    phase = str(kwargs.pop("phase"))
    with pytest.raises(ValueError, match=message):
        trace_phase(model_config("tiny"), phase, **kwargs)  # type: ignore[arg-type]
