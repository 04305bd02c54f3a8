"""From a traced PyTorch graph to an :class:`OperatorGraph`.

Two front ends feed one converter:

* :func:`trace_phase` traces a built-in model with ``torch.fx`` on the ``meta`` device (so even
  Llama-2 70B traces in seconds without memory) and propagates shapes;
* :class:`GraphRecorder` is a ``torch.compile`` backend: it records each graph Dynamo hands it
  and returns the graph's own forward, so the compiled model runs unchanged.

Operators are the compute nodes. View-like nodes (reshape, transpose, slicing, split ...) are
transparent: a consumer reads the tensor the view aliases, while the bytes it reads are the
viewed part. FLOPs follow the usual conventions: a matmul of (M, K) x (K, N) is 2MKN, attention
counts its two matmuls over the full (not causally halved) score matrix, as torch's own
FlopCounterMode does; elementwise ops one FLOP per output element, norms and softmax a few.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from service.domain.model_config import ModelConfig
from service.domain.opgraph import (
    DTYPE_BYTES,
    OperatorGraph,
    OperatorSpec,
    TensorKind,
    TensorSpec,
)
from service.models.family import build_model, example_inputs

F = torch.nn.functional

_VIEW_METHODS = {
    "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "contiguous",
    "split", "chunk", "flatten", "t", "narrow", "select", "unbind", "view_as", "expand_as",
}
_VIEW_FUNCTIONS: set[Any] = {
    operator.getitem, torch.reshape, torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze,
    torch.split, torch.chunk, torch.flatten, torch.narrow, torch.select, torch.unbind, torch.t,
}
_MEMORY = {"cat", "stack", "clone", "to", "type", "float", "half", "bfloat16", "copy_", "concat"}
_CREATION = {"arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like"}
_ACTIVATION = {"gelu": 8, "silu": 4, "relu": 1, "tanh": 4, "sigmoid": 4}
_LAYER_RE = re.compile(r"blocks[._](?:modules[._])?(\d+)")


@dataclass(frozen=True, slots=True)
class _Meta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def size_bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES.get(self.dtype, 4)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _meta_of(value: Any) -> _Meta | list[_Meta | None] | None:
    if isinstance(value, TensorMetadata):
        return _Meta(tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch."))
    if isinstance(value, torch.Tensor):
        return _Meta(tuple(int(d) for d in value.shape), str(value.dtype).removeprefix("torch."))
    if isinstance(value, (list, tuple)):
        return [m if isinstance(m, _Meta) else None for m in (_meta_of(v) for v in value)]
    return None


def _node_meta(node: torch.fx.Node) -> _Meta | list[_Meta | None] | None:
    for key in ("tensor_meta", "val", "example_value"):
        if key in node.meta:
            m = _meta_of(node.meta[key])
            if m is not None:
                return m
    return None


@dataclass
class _Builder:
    model_name: str
    phase: str
    shape: dict[str, int]
    config: dict[str, Any]
    kv_output_index: int | None
    tensors: dict[str, TensorSpec] = field(default_factory=dict)
    operators: list[OperatorSpec] = field(default_factory=list)
    # fx node -> tensor id it stands for (views alias their source); tuples map to lists
    alias: dict[torch.fx.Node, Any] = field(default_factory=dict)

    def add_tensor(self, tid: str, kind: TensorKind, meta: _Meta) -> str:
        if tid not in self.tensors:
            self.tensors[tid] = TensorSpec.of(tid, kind, meta.shape, meta.dtype)
        return tid


def _target_name(node: torch.fx.Node, module: nn.Module | None) -> str:
    if node.op == "call_module" and module is not None:
        return type(module).__name__
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    name = getattr(target, "__name__", str(target))
    return str(name)


def _layer_of(node: torch.fx.Node) -> int:
    texts = [str(node.target)] if node.op == "call_module" else []
    stack = node.meta.get("nn_module_stack") or {}
    texts.extend(str(k) for k in stack)
    texts.extend(str(v[0]) if isinstance(v, tuple) else str(v) for v in stack.values())
    for text in texts:
        m = _LAYER_RE.search(text)
        if m:
            return int(m.group(1))
    return -1


def _tensor_args(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    for a in node.all_input_nodes:
        if a not in seen:
            seen.add(a)
            yield a


def _is_view(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _VIEW_METHODS
    if node.op == "call_function":
        return node.target in _VIEW_FUNCTIONS
    return False


def _classify(name: str, module: nn.Module | None) -> str:
    n = name.lower()
    if isinstance(module, nn.Linear) or n == "linear":
        return "linear"
    if isinstance(module, nn.Embedding) or n == "embedding":
        return "embedding"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or n in ("layer_norm", "rms_norm", "layernorm", "rmsnorm"):
        return "norm"
    if n == "scaled_dot_product_attention":
        return "attention"
    if n in ("matmul", "bmm", "mm", "baddbmm", "addmm"):
        return "matmul"
    if n in ("softmax", "log_softmax"):
        return "softmax"
    if n in _ACTIVATION:
        return "activation"
    if n in _MEMORY:
        return "memory"
    if n in _CREATION:
        return "creation"
    return "elementwise"


def _flops(kind: str, name: str, out: _Meta, ins: Sequence[_Meta], module: nn.Module | None,
           node: torch.fx.Node) -> tuple[int, int]:
    """(flops, workspace_bytes) of one operator from its shapes."""
    if kind == "linear":
        weight = module.weight if isinstance(module, nn.Linear) else None
        if weight is not None:
            k_in, n_out = int(weight.shape[1]), int(weight.shape[0])
            has_bias = module.bias is not None  # type: ignore[union-attr]
        else:  # F.linear(x, w, b): the weight is the second input
            n_out, k_in = ins[1].shape[0], ins[1].shape[-1]
            has_bias = len(ins) > 2
        rows = out.numel // n_out
        return 2 * rows * k_in * n_out + (out.numel if has_bias else 0), 0
    if kind == "matmul":
        k = ins[0].shape[-1] if ins else 1
        return 2 * out.numel * k, 0
    if kind == "attention":
        q, key = ins[0], ins[1]
        b_h_tq = math.prod(q.shape[:-1])
        tk, dh = key.shape[-2], q.shape[-1]
        scores = b_h_tq * tk
        return 4 * scores * dh, scores * DTYPE_BYTES.get(q.dtype, 4)
    if kind == "norm":
        return 5 * out.numel, 0
    if kind == "softmax":
        return 5 * out.numel, 0
    if kind == "activation":
        return _ACTIVATION.get(name.lower(), 1) * out.numel, 0
    if kind in ("memory", "creation", "embedding"):
        return 0, 0
    if name in ("mean", "sum"):
        return sum(m.numel for m in ins), 0
    return out.numel, 0


def graph_from_fx(
    gm: torch.fx.GraphModule,
    *,
    model_name: str,
    phase: str,
    shape: dict[str, int],
    config: dict[str, Any] | None = None,
    param_names: dict[int, str] | None = None,
    weight_placeholders: set[str] | None = None,
    kv_input_names: Sequence[str] = ("kv_cache",),
    kv_output_index: int | None = 1,
) -> OperatorGraph:
    """Convert a shape-annotated fx graph (``tensor_meta`` or ``example_value`` on each node).

    ``param_names`` maps ``id(parameter)`` to its canonical name so tied weights are one tensor.
    ``weight_placeholders`` names placeholders that are lifted parameters (as Dynamo makes them).
    """
    b = _Builder(model_name, phase, dict(shape), dict(config or {}), kv_output_index)
    weight_placeholders = weight_placeholders or set()
    modules = dict(gm.named_modules())
    names = param_names or {}

    def weight_id(owner: str, pname: str, p: torch.Tensor) -> str:
        return "w:" + names.get(id(p), f"{owner}.{pname}" if owner else pname)

    for node in gm.graph.nodes:
        meta = _node_meta(node)
        if node.op == "placeholder":
            if isinstance(meta, _Meta):
                is_weight = node.name in weight_placeholders or str(node.target) in weight_placeholders
                is_kv = any(k in str(node.target) for k in kv_input_names)
                kind: TensorKind = "weight" if is_weight else "kv_cache" if is_kv else "input"
                prefix = {"weight": "w:", "kv_cache": "kv:", "input": "in:"}[kind]
                b.alias[node] = b.add_tensor(prefix + str(node.target), kind, meta)
            continue
        if node.op == "get_attr":
            attr = gm
            for part in str(node.target).split("."):
                attr = getattr(attr, part)
            if isinstance(attr, torch.Tensor) and isinstance(meta, _Meta | type(None)):
                m = meta if isinstance(meta, _Meta) else _meta_of(attr)
                assert isinstance(m, _Meta)
                b.alias[node] = b.add_tensor(weight_id("", str(node.target), attr), "weight", m)
            continue
        if node.op == "output":
            _mark_outputs(b, node)
            continue
        if meta is None:  # sizes, ints and other non-tensor values
            continue
        if _is_view(node):
            src = next((a for a in _tensor_args(node) if a in b.alias), None)
            if src is None:
                continue
            source = b.alias[src]
            if node.target is operator.getitem and isinstance(source, list):
                b.alias[node] = source[int(node.args[1])]
            elif isinstance(meta, list):
                b.alias[node] = [source] * len(meta)
            else:
                b.alias[node] = source
            continue
        module = modules.get(str(node.target)) if node.op == "call_module" else None
        name = _target_name(node, module)
        op_kind = _classify(name, module)
        in_ids: list[str] = []
        in_meta: list[_Meta] = []
        for a in _tensor_args(node):
            if a in b.alias and not isinstance(b.alias[a], list):
                in_ids.append(b.alias[a])
                am = _node_meta(a)
                in_meta.append(am if isinstance(am, _Meta) else b_meta(b, b.alias[a]))
        if module is not None:
            for pname, p in module.named_parameters(recurse=False):
                pid = weight_id(str(node.target), pname, p)
                b.add_tensor(pid, "weight", _Meta(tuple(p.shape), str(p.dtype).removeprefix("torch.")))
                in_ids.append(pid)
                in_meta.append(_Meta(tuple(p.shape), str(p.dtype).removeprefix("torch.")))
        outs = meta if isinstance(meta, list) else [meta]
        out_ids: list[str] = []
        alias_out: list[str] = []
        for i, om in enumerate(outs):
            if om is None:
                continue
            tid = f"a:{node.name}" if len(outs) == 1 else f"a:{node.name}.{i}"
            b.add_tensor(tid, "activation", om)
            out_ids.append(tid)
            alias_out.append(tid)
        if not out_ids:
            continue
        b.alias[node] = alias_out if isinstance(meta, list) else alias_out[0]
        first_out = outs[0] if isinstance(outs[0], _Meta) else next(m for m in outs if m)
        flops, workspace = _flops(op_kind, name, first_out, in_meta, module, node)
        # An embedding gathers rows: it reads its indices and as many weight bytes as it writes.
        read = (in_meta[0].size_bytes + first_out.size_bytes if op_kind == "embedding"
                else sum(m.size_bytes for m in in_meta))
        b.operators.append(OperatorSpec(
            op_id=f"op{len(b.operators):05d}_{node.name}", index=len(b.operators), kind=op_kind,
            target=name, layer=_layer_of(node), flops=int(flops),
            bytes_read=read,
            bytes_written=sum(b.tensors[t].size_bytes for t in out_ids),
            workspace_bytes=int(workspace), inputs=tuple(dict.fromkeys(in_ids)), outputs=tuple(out_ids),
        ))
    graph = OperatorGraph(model_name=model_name, phase=phase,  # type: ignore[arg-type]
                          shape=b.shape, operators=b.operators, tensors=b.tensors, config=b.config)
    return graph.validate()


def b_meta(b: _Builder, tid: str) -> _Meta:
    t = b.tensors[tid]
    return _Meta(t.shape, t.dtype)


def _mark_outputs(b: _Builder, node: torch.fx.Node) -> None:
    """Re-label the returned KV cache activation as ``kv_cache``."""
    if b.kv_output_index is None:
        return
    result = node.args[0]
    if isinstance(result, (tuple, list)) and len(result) > b.kv_output_index:
        kv_node = result[b.kv_output_index]
        tid = b.alias.get(kv_node) if isinstance(kv_node, torch.fx.Node) else None
        if isinstance(tid, str) and b.tensors[tid].kind == "activation":
            t = b.tensors[tid]
            b.tensors[tid] = TensorSpec(t.tensor_id, "kv_cache", t.shape, t.dtype, t.size_bytes)


def _canonical_param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def trace_phase(config: ModelConfig, phase: str, *, batch: int = 1, tokens: int = 128,
                context: int = 512) -> OperatorGraph:
    """Trace one phase of a built-in model on the meta device.

    Prefill: ``batch`` sequences of ``tokens`` tokens. Decode: one new token for each of
    ``batch`` sequences with ``context`` tokens already cached.
    """
    if phase == "prefill":
        if not 0 < tokens <= config.max_seq_len:
            raise ValueError(f"tokens must be in 1..{config.max_seq_len} for {config.name}, got {tokens}")
        shape = {"batch": batch, "tokens": tokens}
    elif phase == "decode":
        if not 0 < context < config.max_seq_len:
            raise ValueError(f"context must be in 1..{config.max_seq_len - 1} for {config.name}, got {context}")
        shape = {"batch": batch, "context": context}
    else:
        raise ValueError(f"unknown phase {phase!r} (expected prefill or decode)")
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    model = build_model(config, device="meta")
    inputs = example_inputs(config, phase, batch=batch, tokens=tokens, context=context, device="meta")
    concrete: dict[str, Any] = {"attn_bias": None, "last_logits_only": False}
    if phase == "prefill":
        concrete["kv_cache"] = None
    gm = torch.fx.symbolic_trace(model, concrete_args=concrete)
    ShapeProp(gm).propagate(*[inputs[n.target] for n in gm.graph.nodes
                              if n.op == "placeholder" and n.target in inputs])
    return graph_from_fx(gm, model_name=config.name, phase=phase, shape=shape,
                         config=config.to_dict(), param_names=_canonical_param_names(model))


class GraphRecorder:
    """A ``torch.compile`` backend that records the graphs it is given.

    >>> rec = GraphRecorder(model_name="tiny", phase="prefill", shape={"batch": 1, "tokens": 8})
    >>> out = torch.compile(model, backend=rec)(**inputs)   # runs eagerly, graph recorded
    >>> rec.graphs[-1]                                       # an OperatorGraph

    Dynamo lifts parameters to graph inputs; they are recognised as ``nn.Parameter`` instances
    among the example inputs and become weight tensors.
    """

    def __init__(self, *, model_name: str, phase: str, shape: dict[str, int],
                 config: dict[str, Any] | None = None, kv_output_index: int | None = 1,
                 on_graph: Callable[[OperatorGraph], None] | None = None) -> None:
        self.model_name, self.phase, self.shape = model_name, phase, shape
        self.config = config or {}
        self.kv_output_index = kv_output_index
        self.on_graph = on_graph
        self.graphs: list[OperatorGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        weights = {n.name for n, x in zip(placeholders, example_inputs, strict=False)
                   if isinstance(x, nn.Parameter) or "_parameters_" in n.name or "_buffers_" in n.name}
        graph = graph_from_fx(
            gm, model_name=self.model_name, phase=self.phase, shape=self.shape, config=self.config,
            weight_placeholders=weights, kv_input_names=("kv_cache",), kv_output_index=self.kv_output_index,
        )
        self.graphs.append(graph)
        if self.on_graph is not None:
            self.on_graph(graph)
        return gm.forward
