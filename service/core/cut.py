"""Slices cut from a model phase's operator graph: one contract, computed in memory here and in
Cypher by the GMG (cypher/read/cut_slices.cypher, :meth:`~service.graph.cut_store.CutStore.cut_slices`).

Pure (no I/O); :func:`service.models.cut.cut_model` traces a model and cuts it here. A *slice* is a contiguous run of
one phase's operators, in their topological index order, executed for one iteration's batch.
The :class:`Granularity` (the quantum, chosen by the policy) groups the transformer layers:

* ``layers=q``: slice ``g`` holds layers ``[g * q, (g + 1) * q)``, part ``"layers"``;
* ``sublayer=True`` (with ``q = 1``): slice ``2L`` is layer ``L``'s *attention* part and
  ``2L + 1`` its *MLP* part. Both block styles are pre-norm (norm, attention, residual add,
  norm, MLP, residual add), so the MLP part starts at the layer's **second** ``norm`` operator:
  the attention part holds the attention norm, the q/k/v projections, rotary embedding, the
  KV stack, attention, the output projection and the residual add after it.

Operators outside the layers (``layer == -1``) join the first slice when they come before the
first layer operator (embeddings, rotary angles), else the last one (final norm, LM head, the
stack of every layer's KV). A cut where some slice would hold no operator of its layers (a layer
without operators, a layer without a second norm) or would not be contiguous is refused with
:class:`InvalidGraphError`.

Per slice, at the traced batch shape (``tokens`` = batch x new tokens):

* ``input_bytes``: distinct ``activation``/``input`` tensors the slice reads that no operator
  of the slice writes (written by another slice, or a graph input);
* ``output_bytes``: distinct ``activation`` tensors the slice writes that an operator of another
  slice reads, or that nobody reads (graph outputs such as the logits);
* ``weight_ids``/``weight_bytes``: the weights its operators read (sorted ids; a tied weight,
  GPT-2's embedding and LM head, is listed by every slice that reads it);
* ``kv_bytes``: its share of the KV cache tensors: each tensor is shared equally by the
  operators that read or write it, ``size * mine // touching`` (decode reads the one
  ``[layers, 2, ...]`` cache tensor twice per layer, so a layer's share is its own part;
  prefill's stacked cache is written by one tail operator, the last slice);
* ``workspace_bytes``: the largest of its operators'; ``flops``: their sum;
* ``predecessors``: the other slices holding a producer of one of its operators (``PRECEDES``).

Activation bytes scale linearly with the batch's tokens (:meth:`SliceCut.bytes_for`); weights,
FLOPs of attention, workspace and KV do not follow that rule and are left at the traced shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.domain.error import InvalidGraphError, InvalidInputError
from service.domain.opgraph import OperatorGraph, OperatorSpec


@dataclass(frozen=True)
class Granularity:
    """How many transformer layers one slice holds (the quantum), or a cut inside each layer.

    ``layers`` must be >= 1 (checked here) and divide the model's layers (:meth:`check`);
    ``sublayer`` cuts each layer into its attention and MLP parts and needs ``layers == 1``.
    """

    layers: int = 1
    sublayer: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise InvalidInputError(f"granularity: layers per slice must be an integer >= 1, got {self.layers!r}")
        if not isinstance(self.sublayer, bool):
            raise InvalidInputError(f"granularity: sublayer must be true or false, got {self.sublayer!r}")
        if self.sublayer and self.layers != 1:
            raise InvalidInputError(
                f"granularity: an attention/MLP cut splits single layers, so it needs layers=1, got layers={self.layers}")

    def check(self, num_layers: int, model_name: str) -> None:
        """Refuse a model this granularity cannot cut: none of its layers, or ``layers`` not dividing them."""
        if num_layers < 1:
            raise InvalidInputError(f"{model_name} has no transformer layers to cut", culprit=model_name)
        if num_layers % self.layers:
            raise InvalidInputError(
                f"granularity of {self.layers} layers does not divide {model_name}'s {num_layers} layers",
                culprit=model_name)

    def num_slices(self, num_layers: int) -> int:
        return 2 * num_layers if self.sublayer else num_layers // self.layers

    def span(self, index: int) -> tuple[int, int, str]:
        """``(first_layer, last_layer, part)`` of slice ``index``."""
        if self.sublayer:
            return index // 2, index // 2, "attention" if index % 2 == 0 else "mlp"
        return index * self.layers, index * self.layers + self.layers - 1, "layers"


@dataclass(frozen=True, slots=True)
class SliceCut:
    """One slice of a model phase (the module docstring defines every field); sizes in bytes."""

    index: int  # 0-based, in execution order
    first_layer: int
    last_layer: int  # inclusive
    part: str  # "layers", "attention" or "mlp"
    op_ids: tuple[str, ...]  # in operator index order
    input_bytes: int
    output_bytes: int
    weight_ids: tuple[str, ...]  # sorted
    weight_bytes: int
    kv_bytes: int
    workspace_bytes: int
    flops: int
    predecessors: tuple[int, ...]  # sorted slice indices
    tokens: int  # the traced batch's tokens (batch x new tokens per sequence)

    def bytes_for(self, tokens: int) -> tuple[int, int]:
        """``(input_bytes, output_bytes)`` for a batch of ``tokens`` tokens (rounded up)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise InvalidInputError(f"tokens must be an integer >= 1, got {tokens!r}")
        return -(-self.input_bytes * tokens // self.tokens), -(-self.output_bytes * tokens // self.tokens)


def num_layers_of(graph: OperatorGraph) -> int:
    """The graph's transformer layers: one more than the largest operator layer (0 if none)."""
    return max((op.layer + 1 for op in graph.operators), default=0)


def check_slices(model_name: str, granularity: Granularity, slices: Sequence[tuple[int, bool]]) -> None:
    """Refuse a cut where a slice has no operator of its layers or is not contiguous; ``slices``:
    ``(number of its operators inside the layers, contiguous)`` per slice."""
    for index, (num_ops, contiguous) in enumerate(slices):
        first, last, part = granularity.span(index)
        what = f"layer {first}'s {part} part" if granularity.sublayer else f"layers {first}-{last}"
        if num_ops == 0:
            hint = " (the MLP part starts at the layer's second norm)" if granularity.sublayer else ""
            raise InvalidGraphError(f"cannot cut {model_name}: {what} has no operators{hint}", culprit=model_name)
        if not contiguous:
            raise InvalidGraphError(
                f"cannot cut {model_name}: {what} is not contiguous in operator order", culprit=model_name)


def _slice_of(ops: Sequence[OperatorSpec], granularity: Granularity, num_layers: int) -> list[int]:
    """The slice of each operator, by position."""
    num_slices = granularity.num_slices(num_layers)
    first_inner = next((op.index for op in ops if op.layer >= 0), len(ops))
    mlp_start: dict[int, int] = {}
    if granularity.sublayer:
        norms: dict[int, list[int]] = {}
        for op in ops:
            if op.layer >= 0 and op.kind == "norm":
                norms.setdefault(op.layer, []).append(op.index)
        mlp_start = {layer: idx[1] for layer, idx in norms.items() if len(idx) > 1}
    out = []
    for op in ops:
        if op.layer < 0:
            out.append(0 if op.index < first_inner else num_slices - 1)
        elif granularity.sublayer:
            start = mlp_start.get(op.layer)
            out.append(2 * op.layer + (1 if start is not None and op.index >= start else 0))
        else:
            out.append(op.layer // granularity.layers)
    return out


def cut_graph(graph: OperatorGraph, granularity: Granularity) -> list[SliceCut]:
    """Cut one phase's operator graph into slices by the contract of this module."""
    num_layers = num_layers_of(graph)
    granularity.check(num_layers, graph.model_name)
    ops = sorted(graph.operators, key=lambda op: op.index)
    slice_of = _slice_of(ops, granularity, num_layers)
    num_slices = granularity.num_slices(num_layers)
    members: list[list[OperatorSpec]] = [[] for _ in range(num_slices)]
    for op, s in zip(ops, slice_of, strict=True):
        members[s].append(op)
    check_slices(graph.model_name, granularity,
                 [(sum(op.layer >= 0 for op in m), bool(m) and m[-1].index - m[0].index + 1 == len(m))
                  for m in members])

    op_slice = {op.op_id: s for op, s in zip(ops, slice_of, strict=True)}
    writer = {t: op_slice[op.op_id] for op in ops for t in op.outputs}
    readers: dict[str, set[int]] = {}
    touching: dict[str, int] = {}
    for op in ops:
        for t in op.inputs:
            readers.setdefault(t, set()).add(op_slice[op.op_id])
        for t in {*op.inputs, *op.outputs}:
            if graph.tensors[t].kind == "kv_cache":
                touching[t] = touching.get(t, 0) + 1
    tokens = graph.num_tokens
    out = []
    for s, group in enumerate(members):
        reads = {t for op in group for t in op.inputs}
        writes = {t for op in group for t in op.outputs}
        size = {t: graph.tensors[t].size_bytes for t in reads | writes}
        kind = {t: graph.tensors[t].kind for t in reads | writes}
        weights = sorted(t for t in reads if kind[t] == "weight")
        mine: dict[str, int] = {}
        for op in group:
            for t in {*op.inputs, *op.outputs}:
                if kind[t] == "kv_cache":
                    mine[t] = mine.get(t, 0) + 1
        first, last, part = granularity.span(s)
        out.append(SliceCut(
            index=s, first_layer=first, last_layer=last, part=part,
            op_ids=tuple(op.op_id for op in group),
            input_bytes=sum(size[t] for t in reads
                            if kind[t] in ("activation", "input") and writer.get(t) != s),
            output_bytes=sum(size[t] for t in writes
                             if kind[t] == "activation" and (not readers.get(t) or readers[t] != {s})),
            weight_ids=tuple(weights), weight_bytes=sum(size[t] for t in weights),
            kv_bytes=sum(size[t] * n // touching[t] for t, n in mine.items()),
            workspace_bytes=max(op.workspace_bytes for op in group),
            flops=sum(op.flops for op in group),
            predecessors=tuple(sorted({writer[t] for t in reads if t in writer} - {s})),
            tokens=tokens,
        ))
    return out
