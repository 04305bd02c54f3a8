"""Operator graphs: the DAG of one model phase, as traced from PyTorch or read from a file.

Pure data with validation; no I/O. A graph is valid when ids are unique, every referenced
tensor exists, every size is positive, every activation has exactly one producer, and the
producer-to-consumer relation is acyclic. Validation names the first culprit it finds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from service.domain.error import InvalidGraphError

TensorKind = Literal["weight", "activation", "kv_cache", "input"]
TENSOR_KINDS: tuple[str, ...] = ("weight", "activation", "kv_cache", "input")
Phase = Literal["prefill", "decode"]
PHASES: tuple[str, ...] = ("prefill", "decode")

DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor. ``size_bytes`` is ``numel * itemsize``; a scalar has shape ``()``."""

    tensor_id: str
    kind: TensorKind
    shape: tuple[int, ...]
    dtype: str
    size_bytes: int

    @staticmethod
    def of(tensor_id: str, kind: TensorKind, shape: tuple[int, ...], dtype: str) -> TensorSpec:
        itemsize = DTYPE_BYTES.get(dtype)
        if itemsize is None:
            raise InvalidGraphError(f"tensor {tensor_id!r}: unknown dtype {dtype!r}", culprit=tensor_id)
        return TensorSpec(tensor_id, kind, tuple(shape), dtype, math.prod(shape) * itemsize)


@dataclass(frozen=True, slots=True)
class OperatorSpec:
    """One operator. ``index`` is its position in a topological order (0-based)."""

    op_id: str
    index: int
    kind: str
    target: str
    layer: int
    flops: int
    bytes_read: int
    bytes_written: int
    workspace_bytes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(slots=True)
class OperatorGraph:
    """The operator DAG of one phase of one model.

    ``shape`` records the phase's size: ``batch`` and ``tokens`` for prefill (tokens per
    request), ``batch`` and ``context`` for decode (tokens already in the KV cache).
    """

    model_name: str
    phase: Phase
    shape: dict[str, int]
    operators: list[OperatorSpec]
    tensors: dict[str, TensorSpec]
    config: dict[str, Any] = field(default_factory=dict)

    # ---- derived views -------------------------------------------------------------------
    def producers(self) -> dict[str, str]:
        """tensor_id -> op_id of the operator that writes it."""
        return {t: op.op_id for op in self.operators for t in op.outputs}

    def edges(self) -> list[tuple[str, str]]:
        """Distinct (producer op, consumer op) pairs: the PRECEDES relation."""
        producer = self.producers()
        seen: set[tuple[str, str]] = set()
        out: list[tuple[str, str]] = []
        for op in self.operators:
            for t in op.inputs:
                src = producer.get(t)
                if src is not None and (src, op.op_id) not in seen:
                    seen.add((src, op.op_id))
                    out.append((src, op.op_id))
        return out

    @property
    def num_tokens(self) -> int:
        """Tokens one iteration at this shape processes: ``batch * tokens`` (prefill), ``batch``
        (decode: one new token per sequence)."""
        per_sequence = self.shape.get("tokens", 1) if self.phase == "prefill" else 1
        return self.shape.get("batch", 1) * per_sequence

    @property
    def total_flops(self) -> int:
        return sum(op.flops for op in self.operators)

    def bytes_of(self, kind: TensorKind) -> int:
        return sum(t.size_bytes for t in self.tensors.values() if t.kind == kind)

    # ---- validation ----------------------------------------------------------------------
    def validate(self) -> OperatorGraph:
        """Raise :class:`InvalidGraphError` naming the first culprit; return ``self`` if valid."""
        if self.phase not in PHASES:
            raise InvalidGraphError(f"unknown phase {self.phase!r} (expected one of {PHASES})")
        for tid, t in self.tensors.items():
            if tid != t.tensor_id:
                raise InvalidGraphError(f"tensor key {tid!r} differs from its id {t.tensor_id!r}", culprit=tid)
            if t.kind not in TENSOR_KINDS:
                raise InvalidGraphError(f"tensor {tid!r}: unknown kind {t.kind!r}", culprit=tid)
            if any(d <= 0 for d in t.shape) or t.size_bytes <= 0:
                raise InvalidGraphError(
                    f"tensor {tid!r}: sizes must be positive (shape {list(t.shape)}, {t.size_bytes} bytes)",
                    culprit=tid,
                )
        seen_ops: set[str] = set()
        writer: dict[str, str] = {}
        for op in self.operators:
            if op.op_id in seen_ops:
                raise InvalidGraphError(f"duplicate operator id {op.op_id!r}", culprit=op.op_id)
            seen_ops.add(op.op_id)
            for name, value in (("flops", op.flops), ("bytes_read", op.bytes_read),
                                ("bytes_written", op.bytes_written), ("workspace_bytes", op.workspace_bytes)):
                if value < 0:
                    raise InvalidGraphError(f"operator {op.op_id!r}: negative {name} ({value})", culprit=op.op_id)
            if not op.outputs:
                raise InvalidGraphError(f"operator {op.op_id!r} writes no tensor", culprit=op.op_id)
            for ref in (*op.inputs, *op.outputs):
                if ref not in self.tensors:
                    raise InvalidGraphError(
                        f"operator {op.op_id!r} references dangling tensor {ref!r}", culprit=ref
                    )
            for ref in op.outputs:
                if ref in writer:
                    raise InvalidGraphError(
                        f"tensor {ref!r} is written by both {writer[ref]!r} and {op.op_id!r}", culprit=ref
                    )
                if self.tensors[ref].kind == "weight":
                    raise InvalidGraphError(f"operator {op.op_id!r} writes weight {ref!r}", culprit=ref)
                writer[ref] = op.op_id
        for tid, t in self.tensors.items():
            if t.kind == "activation" and tid not in writer:
                raise InvalidGraphError(f"activation {tid!r} has no producer (dangling)", culprit=tid)
        self._check_acyclic()
        return self

    def _check_acyclic(self) -> None:
        succ: dict[str, list[str]] = {op.op_id: [] for op in self.operators}
        indeg: dict[str, int] = dict.fromkeys(succ, 0)
        for a, b in self.edges():
            succ[a].append(b)
            indeg[b] += 1
        ready = deque(o for o, d in indeg.items() if d == 0)
        done = 0
        while ready:
            o = ready.popleft()
            done += 1
            for b in succ[o]:
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
        if done != len(succ):
            stuck = sorted(o for o, d in indeg.items() if d > 0)
            raise InvalidGraphError(
                f"operator graph has a cycle through {stuck[:5]}{' ...' if len(stuck) > 5 else ''}",
                culprit=stuck[0],
            )

    # ---- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "phase": self.phase,
            "shape": dict(self.shape),
            "config": dict(self.config),
            "tensors": [
                {"tensor_id": t.tensor_id, "kind": t.kind, "shape": list(t.shape), "dtype": t.dtype}
                for t in self.tensors.values()
            ],
            "operators": [
                {
                    "op_id": op.op_id, "kind": op.kind, "target": op.target, "layer": op.layer,
                    "flops": op.flops, "bytes_read": op.bytes_read, "bytes_written": op.bytes_written,
                    "workspace_bytes": op.workspace_bytes,
                    "inputs": list(op.inputs), "outputs": list(op.outputs),
                }
                for op in self.operators
            ],
        }

    @staticmethod
    def from_dict(data: Any) -> OperatorGraph:
        """Parse and validate a graph document (as written by :meth:`to_dict`)."""
        if not isinstance(data, dict):
            raise InvalidGraphError("a model graph document must be a JSON object")
        try:
            tensors: dict[str, TensorSpec] = {}
            for i, t in enumerate(_list(data, "tensors")):
                tid = str(_field(t, "tensor_id", f"tensors[{i}]"))
                if tid in tensors:
                    raise InvalidGraphError(f"duplicate tensor id {tid!r}", culprit=tid)
                shape = tuple(int(d) for d in _field(t, "shape", tid))
                tensors[tid] = TensorSpec.of(tid, _field(t, "kind", tid), shape, str(_field(t, "dtype", tid)))
            ops = []
            for i, o in enumerate(_list(data, "operators")):
                oid = str(_field(o, "op_id", f"operators[{i}]"))
                ops.append(OperatorSpec(
                    op_id=oid, index=i, kind=str(_field(o, "kind", oid)), target=str(o.get("target", "")),
                    layer=int(o.get("layer", -1)), flops=int(_field(o, "flops", oid)),
                    bytes_read=int(o.get("bytes_read", 0)), bytes_written=int(o.get("bytes_written", 0)),
                    workspace_bytes=int(o.get("workspace_bytes", 0)),
                    inputs=tuple(str(x) for x in _field(o, "inputs", oid)),
                    outputs=tuple(str(x) for x in _field(o, "outputs", oid)),
                ))
            phase_shape = {str(k): int(v) for k, v in dict(data.get("shape", {})).items()}
            graph = OperatorGraph(
                model_name=str(_field(data, "model_name", "graph")), phase=data.get("phase", "prefill"),
                shape=phase_shape, operators=ops, tensors=tensors, config=dict(data.get("config", {})),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidGraphError(f"malformed model graph: {exc}") from exc
        return graph.validate()


def _list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise InvalidGraphError(f"model graph: {key!r} must be a list of objects")
    return value


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise InvalidGraphError(f"{where}: missing field {key!r}", culprit=where)
    return obj[key]
