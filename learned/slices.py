"""Slices of traced models timed by the Vidur profiles: the GNN's per-slice training and held-out data.

A slice is a contiguous group of one layer stack's operators with its real intra-slice edges
(:func:`service.core.cost.slice_of` over a traced :class:`~service.domain.opgraph.OperatorGraph`,
so the residual connections make it a DAG, not a chain). Kinds (:data:`SLICE_KINDS`): the
attention part of a layer, its MLP part, a whole layer, the MLP part of one layer with the
attention part of the next (a cut across the layer boundary), two and three layers.

Graphs: :func:`~service.models.trace.trace_phase` (prefill of one sequence of ``T`` tokens, on
the meta device) of a llama-style config with each profiled model's own shape, read from its
``mlp.csv`` columns (:func:`vidur_configs`), three layers deep (every layer has the same shapes).

Times, per profile row (device, model, tokens, TP 1): each traced operator is timed by the Vidur
operator that runs it (:func:`layer_roles`): the layer norms, ``attn_post_proj``,
``mlp_down_proj`` and the residual adds one to one (Vidur times one add per layer; both of a
layer's adds have its shape, so each gets that time); Vidur's fused kernels cover several traced
nodes: ``attn_pre_proj`` = q, k and v projections, ``attn_rope`` = the ten rotary elementwise and
copy nodes, ``mlp_up_proj`` = gate and up projections, ``mlp_act`` = SiLU and the product. A
slice's time is the sum of the Vidur operators it covers (a slice never splits a fused kernel);
a node's own target is known only where it is a whole kernel.

Not timed: the attention kernel and the KV-cache write (``stack``). The attention profile holds
one shape (Llama-2-70B at TP 2, A100 only), no held-out model or GPU. Those nodes stay in the
graph (they pass messages) with ``counted=False``: the target and every model's prediction are
the time of the counted operators. Left out: TP > 1 rows (a traced graph is a whole layer on
one device) and non-gated models (phi-2: parallel attention and MLP, no post-attention norm).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from learned.gnn import GraphSample
from learned.profile import LAYER_CHAIN, OpTiming, layer_chains, vidur_mlp_files, vidur_model_dir
from learned.roofline import device_of_kind
from service.core.cost import Edge, OpFeatures, slice_of
from service.domain.cluster import Device
from service.domain.model_config import ModelConfig
from service.domain.opgraph import OperatorGraph, OperatorSpec
from service.models.trace import trace_phase

SLICE_KINDS: tuple[str, ...] = ("attention", "mlp", "layer", "mlp+attention", "2 layers", "3 layers")
TRACE_LAYERS = 3
# (layer, part) pieces of each kind in a TRACE_LAYERS-deep trace; part 0 = attention, 1 = MLP
_PIECES: dict[str, tuple[tuple[int, int], ...]] = {
    "attention": ((1, 0),), "mlp": ((1, 1),), "layer": ((1, 0), (1, 1)), "mlp+attention": ((0, 1), (1, 0)),
    "2 layers": ((0, 0), (0, 1), (1, 0), (1, 1)), "3 layers": tuple((i, p) for i in range(3) for p in (0, 1)),
}
_LINEAR_ROLES = ("attn_pre_proj",) * 3 + ("attn_post_proj", "mlp_up_proj", "mlp_up_proj", "mlp_down_proj")
# Other operators by how many of the layer's linears precede them.
_BETWEEN_ROLES = {3: "attn_rope", 4: "add", 5: "mlp_act", 6: "mlp_act", 7: "add"}


@dataclass(frozen=True, slots=True)
class TimedSlice:
    """One slice on one profiled row: ``sample.target_ms`` is its measured time."""

    kind: str
    model: str
    tokens: int
    sample: GraphSample


@dataclass(frozen=True, slots=True)
class _Template:
    """A slice of one traced graph: features, edges, and per node (layer, part, Vidur op or None)."""

    kind: str
    ops: tuple[OpFeatures, ...]
    edges: tuple[Edge, ...]
    roles: tuple[tuple[int, int, str | None], ...]


def vidur_configs(compute_root: Path) -> dict[str, ModelConfig]:
    """A shape-only llama-style config per gated model profiled under ``compute_root``, from the
    first row of its ``mlp.csv``: width, heads, KV heads, MLP width and vocabulary."""
    out: dict[str, ModelConfig] = {}
    for path in vidur_mlp_files(compute_root):
        _, model = vidur_model_dir(path)
        if model in out:
            continue
        with path.open(newline="") as f:
            row = next(csv.DictReader(f), None)
        if row is None or row["use_gated_mlp"].strip().lower() != "true":
            continue
        out[model] = ModelConfig(model, "llama", vocab_size=int(row["vocab_size"]), d_model=int(row["n_embd"]),
                                 n_layers=TRACE_LAYERS, n_heads=int(row["n_head"]), n_kv_heads=int(row["n_kv_head"]),
                                 d_ff=int(row["n_expanded_embd"]), max_seq_len=1 << 16, dtype="bfloat16",
                                 shape_only=True)
    return out


def layer_roles(ops: Sequence[OperatorSpec]) -> list[tuple[int, str | None]]:
    """Per operator of one traced llama-style layer (in order): its part (0 attention, 1 MLP) and
    the Vidur operator that times it (None: not timed by the profiles)."""
    linears = norms = 0
    out: list[tuple[int, str | None]] = []
    part = 0
    for op in ops:
        role: str | None
        if op.kind == "norm" and norms < 2:
            role = ("input_layernorm", "post_attention_layernorm")[norms]
            norms += 1
        elif op.kind == "linear" and linears < len(_LINEAR_ROLES):
            role = _LINEAR_ROLES[linears]
            linears += 1
        elif op.kind == "attention" or op.target == "stack":
            role = None
        elif linears in _BETWEEN_ROLES:
            role = _BETWEEN_ROLES[linears]
        else:
            raise ValueError(f"operator {op.op_id} ({op.kind}) is not where a llama-style layer has one")
        if role == "post_attention_layernorm":
            part = 1
        out.append((part, role))
    if linears != len(_LINEAR_ROLES) or norms != 2 or sum(op.kind == "attention" for op in ops) != 1:
        raise ValueError(f"layer {ops[0].layer if ops else '?'} is not a llama-style layer "
                         f"({linears} linears, {norms} norms)")
    return out


@lru_cache(maxsize=4096)
def _templates(config: ModelConfig, tokens: int) -> tuple[_Template, ...]:
    graph = trace_phase(config, "prefill", batch=1, tokens=tokens)
    return tuple(slice_templates(graph))


def slice_templates(graph: OperatorGraph) -> list[_Template]:
    """Every kind of :data:`SLICE_KINDS` cut from a traced graph of at least three layers."""
    role_of: dict[str, tuple[int, int, str | None]] = {}
    for layer in range(TRACE_LAYERS):
        ops = [op for op in graph.operators if op.layer == layer]
        for op, (part, role) in zip(ops, layer_roles(ops), strict=True):
            role_of[op.op_id] = (layer, part, role)
    index = {op.op_id: op.index for op in graph.operators}
    out = []
    for kind in SLICE_KINDS:
        pieces = set(_PIECES[kind])
        ids = sorted((o for o, (layer, part, _) in role_of.items() if (layer, part) in pieces), key=index.__getitem__)
        features, edges = slice_of(graph, ids)  # in the graph's order, as ``ids``
        out.append(_Template(kind, tuple(features), tuple(edges), tuple(role_of[o] for o in ids)))
    return out


def token_picks(values: Sequence[int], count: int | None) -> list[int]:
    """About ``count`` of ``values`` spread evenly in log tokens (all of them when None)."""
    distinct = sorted(set(values))
    if count is None or count >= len(distinct):
        return distinct
    logs = np.log(np.asarray(distinct, dtype=float))
    targets = np.linspace(logs[0], logs[-1], count)
    return sorted({distinct[int(np.argmin(np.abs(logs - t)))] for t in targets})


def timed_slices(rows: Sequence[OpTiming], configs: dict[str, ModelConfig], *,
                 tokens_per_model: int | None = None) -> list[TimedSlice]:
    """Every slice kind on every full TP-1 layer row of ``rows`` whose model has a config;
    ``tokens_per_model``: only that many token counts per model (log-spaced; None: all)."""
    chains = [c for c in layer_chains([t for t in rows if t.tp == 1 and t.model in configs])
              if tuple(t.op for t in c) == LAYER_CHAIN]
    picks = {m: set(token_picks([c[0].tokens for c in chains if c[0].model == m], tokens_per_model))
             for m in {c[0].model for c in chains}}
    devices: dict[str, Device] = {}
    out: list[TimedSlice] = []
    for chain in chains:
        first = chain[0]
        if first.tokens not in picks[first.model]:
            continue
        device = devices.setdefault(first.device_kind, device_of_kind(first.device_kind))
        times = {t.op: t.p50_ms for t in chain}
        for tpl in _templates(configs[first.model], first.tokens):
            out.append(TimedSlice(tpl.kind, first.model, first.tokens, _sample(tpl, times, device)))
    return out


def _sample(tpl: _Template, times: dict[str, float], device: Device) -> GraphSample:
    groups: dict[tuple[int, int, str], int] = {}
    for layer, part, role in tpl.roles:
        if role is not None:
            groups[(layer, part, role)] = groups.get((layer, part, role), 0) + 1
    target = math.fsum(times[role] for (_, _, role) in groups)
    node_ms = tuple(math.nan if role is None or groups[(layer, part, role)] > 1 else times[role]
                    for layer, part, role in tpl.roles)
    return GraphSample(tpl.ops, device, target, node_ms, tpl.edges, tuple(r is not None for _, _, r in tpl.roles))
