"""The cost-model contract: what a slice of operators costs on a device.

Pure (no I/O). A cost model sees operators as :class:`OpFeatures` (shape-level facts, not fx
nodes) and a :class:`~service.domain.cluster.Device`; it answers a :class:`Latency` with
quantiles. Implementations live in ``learned/`` (roofline, profile table, GNN); the simulator
only depends on this protocol. :func:`physical_floor_s` is the one physical lower bound every
answer must respect (memory bandwidth and peak FLOP/s); :class:`FlooredCostModel` holds any
model to it, and the simulator prices through one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from service.domain.cluster import Device
from service.domain.error import InvalidInputError
from service.domain.opgraph import OperatorGraph, OperatorSpec

# Operator kinds a cost model must accept (see service.models.trace._classify).
OP_KINDS: tuple[str, ...] = (
    "linear", "matmul", "attention", "norm", "softmax", "activation", "elementwise",
    "embedding", "memory", "creation",
)


@dataclass(frozen=True, slots=True)
class OpFeatures:
    """One operator's work.

    ``tokens``: rows processed (batch x sequence positions; for attention the query tokens).
    ``dim_in`` / ``dim_out``: inner and output feature sizes (linear: in/out features; attention:
    heads x head_dim of queries and of keys). ``context``: keys each query attends to
    (attention only, else 0). ``batch``: sequences. ``dtype_bytes``: element size.
    """

    kind: str
    flops: float
    bytes_moved: float
    tokens: int = 1
    dim_in: int = 0
    dim_out: int = 0
    context: int = 0
    batch: int = 1
    dtype_bytes: int = 2


@dataclass(frozen=True, slots=True)
class Latency:
    """Predicted latency in seconds: median and upper quantiles (p50 <= p90 <= p99)."""

    p50_s: float
    p90_s: float
    p99_s: float

    @staticmethod
    def exact(seconds: float) -> Latency:
        return Latency(seconds, seconds, seconds)

    def __add__(self, other: Latency) -> Latency:
        # Quantiles of a sum are not sums of quantiles; adding them is the conservative bound
        # the scheduler wants for tail-aware decisions.
        return Latency(self.p50_s + other.p50_s, self.p90_s + other.p90_s, self.p99_s + other.p99_s)

    def scaled(self, factor: float) -> Latency:
        return Latency(self.p50_s * factor, self.p90_s * factor, self.p99_s * factor)


ZERO = Latency(0.0, 0.0, 0.0)


@runtime_checkable
class CostModel(Protocol):
    """Latency of a slice (a contiguous group of operators) on one device."""

    @property
    def name(self) -> str: ...

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        """Latency of running ``ops`` back to back on ``device``. Must be cheap and pure."""
        ...


Edge = tuple[int, int]


@runtime_checkable
class GraphCostModel(Protocol):
    """A cost model that reads a slice's operator subgraph, not only its operator sequence."""

    def predict_graph(self, ops: Sequence[OpFeatures], edges: Sequence[Edge], device: Device) -> Latency:
        """Latency of the slice ``ops`` whose data dependencies are ``edges``: (producer,
        consumer) positions in ``ops``. ``predict(ops, device)`` is the chain
        ``[(0, 1), (1, 2), ...]``. Bad edges are an :class:`InvalidInputError`."""
        ...


def chain_edges(num_ops: int) -> tuple[Edge, ...]:
    """The edges :meth:`CostModel.predict` assumes: each operator feeds the next."""
    return tuple((i, i + 1) for i in range(num_ops - 1))


def check_edges(num_ops: int, edges: Sequence[Edge]) -> tuple[Edge, ...]:
    """``edges`` as sorted, distinct ``(low, high)`` position pairs; a cost model that passes
    messages both ways sees nothing else of them (direction and repeats do not matter).

    Raises :class:`InvalidInputError` for a pair that is not two integers, a position outside
    ``0 .. num_ops - 1`` or an operator feeding itself.
    """
    out: set[Edge] = set()
    for edge in edges:
        if len(edge) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in edge):
            raise InvalidInputError(f"edge {edge!r}: expected a pair of operator positions", culprit=repr(edge))
        a, b = edge
        if not (0 <= a < num_ops and 0 <= b < num_ops):
            raise InvalidInputError(f"edge {edge!r}: positions must be in 0..{num_ops - 1} for a slice of "
                                    f"{num_ops} operators", culprit=repr(edge))
        if a == b:
            raise InvalidInputError(f"edge {edge!r}: an operator cannot feed itself", culprit=repr(edge))
        out.add((a, b) if a < b else (b, a))
    return tuple(sorted(out))


def predict_slice(model: CostModel, ops: Sequence[OpFeatures], edges: Sequence[Edge], device: Device) -> Latency:
    """Latency of a slice with its real edges: :meth:`GraphCostModel.predict_graph` where the model
    has it, else ``model.predict(ops, device)`` (a model that prices each operator alone, as the
    table and the roofline do, sums them whatever the edges). Edges are checked either way."""
    if isinstance(model, GraphCostModel):
        return model.predict_graph(ops, edges, device)
    check_edges(len(ops), edges)
    return model.predict(ops, device)


@dataclass(frozen=True, slots=True)
class IterationOverhead:
    """Host-side time of one serving iteration that no operator profile sees (framework
    dispatch, batch assembly, sampling, cache bookkeeping), in seconds: a fixed part, a part per
    prefilled sequence and a part per decoding sequence. Vidur models the same CPU overheads
    separately from its operator profiles; here they are fitted on observed iterations.
    """

    per_iteration_s: float = 0.0
    per_prefill_seq_s: float = 0.0
    per_decode_s: float = 0.0
    # The executor runs each prompt as its own forward pass (batch of one) and the decodes as one
    # batched pass, instead of one fused pass: every pass streams the weights again.
    separate_prefill_passes: bool = False

    def seconds(self, num_prefill_seqs: int, num_decodes: int) -> float:
        return self.per_iteration_s + self.per_prefill_seq_s * num_prefill_seqs + self.per_decode_s * num_decodes


NO_OVERHEAD = IterationOverhead()


@runtime_checkable
class StackedCostModel(Protocol):
    """A cost model that prices a repeated block (a model's layers) without unrolling it."""

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        """Same answer as ``predict(prefix + block * repeats + suffix, device)``."""
        ...


@runtime_checkable
class HostOverheadModel(Protocol):
    """A cost model that also knows the host-side time per iteration on a device."""

    def iteration_overhead(self, device: Device) -> IterationOverhead: ...


def floor_work(ops: Sequence[OpFeatures]) -> tuple[float, float]:
    """(bytes, FLOPs) no kernel can avoid for ``ops``: each operator's stated bytes (weights read
    once, the KV of every sequence's context, activations in and out) and FLOPs, except that a
    prefill attention's FLOPs count half: its full score matrix is stated, and a causal kernel
    skips at most the upper triangle (decode queries see every key: counted whole)."""
    moved = flops = 0.0
    for op in ops:
        moved += op.bytes_moved
        causal = op.kind == "attention" and op.tokens > op.batch
        flops += op.flops / 2 if causal else op.flops
    return moved, flops


def physical_floor_s(ops: Sequence[OpFeatures], device: Device, *, block: Sequence[OpFeatures] = (),
                     repeats: int = 0) -> float:
    """The fewest seconds ``ops`` plus ``repeats`` runs of ``block`` can take on ``device``:
    ``max(bytes / memory bandwidth, FLOPs / peak FLOP/s)`` over their :func:`floor_work`, at the
    datasheet numbers (no device beats them; nothing overlaps a device's memory with itself).
    A lower bound for any cost model's median."""
    moved, flops = floor_work(ops)
    if repeats and block:
        block_moved, block_flops = floor_work(block)
        moved, flops = moved + repeats * block_moved, flops + repeats * block_flops
    return max(moved / device.mem_bw_bytes_per_s, flops / device.peak_flops)


def floored(model: CostModel) -> FlooredCostModel:
    """``model`` clamped at the physical floor (itself when it already is)."""
    return model if isinstance(model, FlooredCostModel) else FlooredCostModel(model)


def at_least(latency: Latency, floor_s: float) -> Latency:
    """``latency`` with every quantile raised to ``floor_s`` where below it (order kept)."""
    if latency.p50_s >= floor_s:
        return latency
    return Latency(floor_s, max(latency.p90_s, floor_s), max(latency.p99_s, floor_s))


class FlooredCostModel:
    """A cost model whose answers never fall below :func:`physical_floor_s` of the work priced.

    Wraps any :class:`CostModel` and keeps what it offers: :meth:`predict_graph` goes through
    :func:`predict_slice` of the inner model (its real edges where it reads them),
    :meth:`predict_stack` through its stack pricing where it has one (else the unrolled
    :meth:`predict`, the same answer), :meth:`iteration_overhead` is the inner model's (none when
    it has none). Each answer is clamped at the floor of exactly the operators it prices: a whole
    iteration (weights once, every sequence's KV, activations) or a slice (its operators' share).
    The name is the inner model's.
    """

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        return at_least(self.inner.predict(ops, device), physical_floor_s(ops, device))

    def predict_graph(self, ops: Sequence[OpFeatures], edges: Sequence[Edge], device: Device) -> Latency:
        return at_least(predict_slice(self.inner, ops, edges, device), physical_floor_s(ops, device))

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        if isinstance(self.inner, StackedCostModel):
            lat = self.inner.predict_stack(prefix, block, repeats, suffix, device)
        else:
            lat = self.inner.predict([*prefix, *(list(block) * repeats), *suffix], device)
        return at_least(lat, physical_floor_s([*prefix, *suffix], device, block=block, repeats=repeats))

    def iteration_overhead(self, device: Device) -> IterationOverhead:
        return self.inner.iteration_overhead(device) if isinstance(self.inner, HostOverheadModel) else NO_OVERHEAD


def features_of(op: OperatorSpec, graph: OperatorGraph) -> OpFeatures:
    """Shape-level features of a traced operator."""
    acts = [graph.tensors[t] for t in op.inputs if graph.tensors[t].kind != "weight"]
    weights = [graph.tensors[t] for t in op.inputs if graph.tensors[t].kind == "weight"]
    out = graph.tensors[op.outputs[0]]
    dtype_bytes = max(1, out.size_bytes // max(1, math.prod(out.shape)))
    bytes_moved = float(op.bytes_read + op.bytes_written)
    if op.kind == "attention" and len(acts) >= 2:
        q, k = acts[0].shape, acts[1].shape
        batch = q[0] if len(q) == 4 else 1
        tokens = math.prod(q[:-3]) * q[-2] if len(q) >= 3 else 1
        return OpFeatures(op.kind, float(op.flops), bytes_moved, tokens=int(tokens),
                          dim_in=int(q[-3] * q[-1]) if len(q) >= 3 else q[-1],
                          dim_out=int(k[-3] * k[-1]) if len(k) >= 3 else k[-1],
                          context=int(k[-2]), batch=int(batch), dtype_bytes=dtype_bytes)
    x = acts[0].shape if acts else out.shape
    tokens = math.prod(x[:-1]) if len(x) > 1 else 1
    batch = x[0] if len(x) > 1 else 1
    if op.kind == "linear" and weights:
        # Rows from the output: the input may be a view of another shape (heads x head_dim).
        w, rows = weights[0].shape, math.prod(out.shape[:-1]) if len(out.shape) > 1 else 1
        return OpFeatures(op.kind, float(op.flops), bytes_moved, tokens=int(rows), dim_in=int(w[-1]),
                          dim_out=int(w[0]), batch=int(out.shape[0] if len(out.shape) > 1 else 1),
                          dtype_bytes=dtype_bytes)
    return OpFeatures(op.kind, float(op.flops), bytes_moved, tokens=int(tokens),
                      dim_in=int(x[-1]) if x else 1, dim_out=int(out.shape[-1]) if out.shape else 1,
                      batch=int(batch), dtype_bytes=dtype_bytes)


def graph_features(graph: OperatorGraph) -> list[OpFeatures]:
    return [features_of(op, graph) for op in graph.operators]


def slice_of(graph: OperatorGraph, op_ids: Sequence[str]) -> tuple[list[OpFeatures], list[Edge]]:
    """The operators ``op_ids`` of ``graph`` as a cost model reads them: their features in the
    graph's (topological) order, and the graph's producer -> consumer edges between them as
    positions in that list (edges from or to operators outside the slice are left out).

    Raises :class:`InvalidInputError` for an empty slice, an unknown or a repeated op id.
    """
    if not op_ids:
        raise InvalidInputError(f"an empty slice of {graph.model_name!r}")
    index = {op.op_id: op for op in graph.operators}
    chosen: set[str] = set()
    for op_id in op_ids:
        if op_id not in index:
            raise InvalidInputError(f"operator {op_id!r} is not in the graph of {graph.model_name!r} "
                                    f"({graph.phase})", culprit=op_id)
        if op_id in chosen:
            raise InvalidInputError(f"operator {op_id!r} is named twice in one slice", culprit=op_id)
        chosen.add(op_id)
    members = sorted((index[o] for o in chosen), key=lambda op: op.index)
    position = {op.op_id: i for i, op in enumerate(members)}
    edges = [(position[a], position[b]) for a, b in graph.edges() if a in position and b in position]
    return [features_of(op, graph) for op in members], edges
