"""Operator timing records and their readers: one tidy row type for every profile source.

Sources:

* Vidur ``compute/<gpu>/<org>/<model>/mlp.csv``: one row = one transformer layer's non-attention
  operators (plus the embedding) at ``num_tokens`` tokens and a tensor-parallel degree. Each
  operator becomes one :class:`OpTiming` with the shapes *per TP worker* derived from the
  model columns (``n_embd``, ``n_head``, ``n_kv_head``, ``n_expanded_embd``, ``use_gated_mlp``).
* Vidur's legacy A100 ``attention.csv``: FlashAttention prefill and decode kernels.
* SplitwiseSim ``perf_model.csv``: end-to-end prompt/token times, a separate
  :class:`EndToEndTiming` record (iteration-level ground truth, not per operator).
* :class:`ProfileStore`: the CSV format our own CPU profiler writes (same columns as
  :class:`OpTiming`).

All times are milliseconds, as in the sources. Readers read files in place and do no caching.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from service.core.cost import IterationOverhead, OpFeatures

# Vidur's GPU folder names -> DEVICE_KINDS names.
VIDUR_DEVICE_KINDS: dict[str, str] = {"a100": "A100-80GB", "h100": "H100-80GB", "a40": "A40"}
SPLITWISE_DEVICE_KINDS: dict[str, str] = {
    "a100-80gb": "A100-80GB", "h100-80gb": "H100-80GB", "h100-80gb-pcap": "H100-80GB",
}

# Vidur operator name -> our OpFeatures kind.
VIDUR_OP_KINDS: dict[str, str] = {
    "emb": "embedding",
    "input_layernorm": "norm",
    "attn_pre_proj": "linear",
    "attn_rope": "elementwise",
    "attn_post_proj": "linear",
    "post_attention_layernorm": "norm",
    "mlp_up_proj": "linear",
    "mlp_act": "activation",
    "mlp_down_proj": "linear",
    "add": "elementwise",
}
# One transformer layer's non-attention operators in execution order (the residual add once,
# as Vidur measures it once per layer).
LAYER_CHAIN: tuple[str, ...] = (
    "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
)


@dataclass(frozen=True, slots=True)
class OpTiming:
    """One measured operator shape: latency statistics in milliseconds.

    ``op`` is the source's operator name (Vidur's, or our kind for our profiler); ``kind`` is
    the :class:`~service.core.cost.OpFeatures` kind. Shapes are per device (per TP worker).
    ``tokens``/``dim_in``/``dim_out``/``context``/``batch`` mean what they mean in OpFeatures.
    ``tp`` is the tensor-parallel degree the shape was cut for (1 for our profiler).
    """

    device_kind: str
    model: str
    op: str
    kind: str
    tokens: int
    dim_in: int
    dim_out: int
    context: int
    batch: int
    tp: int
    p50_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float


@dataclass(frozen=True, slots=True)
class EndToEndTiming:
    """One SplitwiseSim measurement of a whole batch (milliseconds)."""

    device_kind: str
    power_capped: bool
    model: str
    prompt_tokens: int
    batch: int
    output_tokens: int
    tp: int
    prompt_ms: float
    token_ms: float
    e2e_ms: float


_INT_FIELDS = {f.name for f in fields(OpTiming) if f.type in ("int", int)}
_FLOAT_FIELDS = {f.name for f in fields(OpTiming) if f.type in ("float", float)}
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(OpTiming))


def _stats(row: dict[str, str], op: str) -> tuple[float, float, float, float, float] | None:
    prefix = f"time_stats.{op}."
    raw = row.get(prefix + "median")
    if raw is None or raw == "":
        return None
    return (float(raw), float(row[prefix + "mean"]), float(row[prefix + "std"] or 0.0),
            float(row[prefix + "min"]), float(row[prefix + "max"]))


def _vidur_dims(op: str, row: dict[str, str]) -> tuple[int, int]:
    """(dim_in, dim_out) of a Vidur operator on one TP worker."""
    d, heads, kv_heads = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
    ff, tp = int(row["n_expanded_embd"]), int(row["num_tensor_parallel_workers"])
    gated = row["use_gated_mlp"].strip().lower() == "true"
    head_dim = d // heads
    up = (2 if gated else 1) * ff // tp
    dims = {
        "emb": (int(row["vocab_size"]) // tp, d),
        "input_layernorm": (d, d),
        "post_attention_layernorm": (d, d),
        "attn_pre_proj": (d, (heads + 2 * kv_heads) * head_dim // tp),
        "attn_rope": ((heads + kv_heads) * head_dim // tp, (heads + kv_heads) * head_dim // tp),
        "attn_post_proj": (d // tp, d),
        "mlp_up_proj": (d, up),
        "mlp_act": (up, ff // tp),
        "mlp_down_proj": (ff // tp, d),
        "add": (d, d),
    }
    return dims[op]


def vidur_model_dir(path: Path) -> tuple[str, str]:
    """(device_kind, model) of ``.../compute/<gpu>/<org>/<model>/mlp.csv``."""
    gpu = path.parent.parent.parent.name
    if gpu not in VIDUR_DEVICE_KINDS:
        raise ValueError(f"{path}: unknown Vidur GPU folder {gpu!r} (known: {', '.join(VIDUR_DEVICE_KINDS)})")
    return VIDUR_DEVICE_KINDS[gpu], path.parent.name


def read_vidur_mlp(path: Path) -> list[OpTiming]:
    """Every operator of every row of one Vidur ``mlp.csv`` (ops missing in a file are skipped)."""
    device_kind, model = vidur_model_dir(path)
    out: list[OpTiming] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            tokens, tp = int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])
            for op, kind in VIDUR_OP_KINDS.items():
                stats = _stats(row, op)
                if stats is None:
                    continue
                dim_in, dim_out = _vidur_dims(op, row)
                out.append(OpTiming(device_kind, model, op, kind, tokens, dim_in, dim_out, 0, 1, tp, *stats))
    return out


def vidur_mlp_files(root: Path) -> list[Path]:
    """All ``mlp.csv`` files under a Vidur ``profiling`` (or ``compute``) folder, sorted."""
    return sorted(root.rglob("mlp.csv"))


def read_vidur_compute(root: Path) -> list[OpTiming]:
    return [t for p in vidur_mlp_files(root) for t in read_vidur_mlp(p)]


def read_vidur_attention(path: Path, *, device_kind: str = "A100-80GB",
                         model: str = "Llama-2-70b-hf") -> list[OpTiming]:
    """The legacy attention profile: one record per row (prefill or decode).

    Prefill rows: ``tokens`` = chunk size, ``context`` = cached + chunk tokens, one sequence.
    Decode rows: ``tokens`` = ``batch`` = batch size (one query each), ``context`` = cached tokens.
    ``dim_in``/``dim_out`` are the query and key widths per TP worker. The file holds the
    attention shape of Llama-2-70B / CodeLlama-34B at TP 2, hence the default ``model``.
    """
    out: list[OpTiming] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            d, q_heads, kv_heads = int(row["n_embd"]), int(row["n_q_head"]), int(row["n_kv_head"])
            tp, head_dim = int(row["num_tensor_parallel_workers"]), d // q_heads
            dim_in, dim_out = q_heads * head_dim // tp, kv_heads * head_dim // tp
            cached, batch = int(row["kv_cache_size"]), int(row["batch_size"])
            if row["is_prefill"].strip() == "True":
                chunk = int(row["prefill_chunk_size"])
                stats = _stats(row, "attn_prefill")
                op, tokens, context = "attn_prefill", chunk * batch, cached + chunk
            else:
                stats = _stats(row, "attn_decode")
                op, tokens, context = "attn_decode", batch, cached
            if stats is None or tokens <= 0:
                continue
            out.append(OpTiming(device_kind, model, op, "attention", tokens, dim_in, dim_out, context, batch, tp,
                                *stats))
    return out


def read_splitwise(path: Path) -> list[EndToEndTiming]:
    """SplitwiseSim ``perf_model.csv`` rows (the power-capped H100 is flagged, not renamed)."""
    out: list[EndToEndTiming] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            hw = row["hardware"].strip()
            out.append(EndToEndTiming(
                device_kind=SPLITWISE_DEVICE_KINDS[hw], power_capped=hw.endswith("pcap"), model=row["model"],
                prompt_tokens=int(row["prompt_size"]), batch=int(row["batch_size"]),
                output_tokens=int(row["token_size"]), tp=int(row["tensor_parallel"]),
                prompt_ms=float(row["prompt_time"]), token_ms=float(row["token_time"]),
                e2e_ms=float(row["e2e_time"]),
            ))
    return out


class ProfileStore:
    """A CSV file of :class:`OpTiming` rows with a header of exactly :data:`COLUMNS`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def save(self, timings: Iterable[OpTiming]) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            for t in timings:
                w.writerow([repr(v) if isinstance(v, float) else v for v in (getattr(t, c) for c in COLUMNS)])
        return self.path

    def load(self) -> list[OpTiming]:
        with self.path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                raise ValueError(f"{self.path}: expected columns {COLUMNS}, got {reader.fieldnames}")
            rows: list[OpTiming] = []
            for row in reader:
                values: dict[str, Any] = {k: int(v) if k in _INT_FIELDS else float(v) if k in _FLOAT_FIELDS else v
                                          for k, v in row.items()}
                rows.append(OpTiming(**values))
            return rows


# Host-side parts of one engine step as Vidur sums them (model_execution overlaps the GPU).
_OVERHEAD_COLUMNS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
                     "process_model_outputs_median")


def fit_host_overhead(path: Path) -> IterationOverhead | None:
    """Least squares of the host milliseconds per step on ``[1, batch size]`` over the TP-1 rows
    of a Vidur ``cpu_overheads.csv``; None without such rows."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["tensor_parallel_degree"]) == 1]
    if not rows:
        return None
    x = np.array([[1.0, float(r["batch_size"])] for r in rows])
    y = np.array([sum(float(r[c]) for c in _OVERHEAD_COLUMNS) for r in rows]) / 1e3
    coef = np.clip(np.linalg.lstsq(x, y, rcond=None)[0], 0.0, None)
    return IterationOverhead(float(coef[0]), float(coef[1]), float(coef[1]))


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (names training data in artifact hashes)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def timing_features(t: OpTiming, dtype_bytes: int = 2) -> OpFeatures:
    """The :class:`OpFeatures` of a timed operator, with FLOPs and bytes by the tracer's conventions.

    linear 2*T*K*N FLOPs, reading activations and weights and writing outputs; attention
    4*T*C*dim_in (two matmuls over the full score matrix); norms 5, activations 4 (8 for GELU
    is folded into the kind's efficiency) and elementwise 1 FLOP per output element;
    embeddings move rows only.
    """
    tk, di, do, b = max(1, t.tokens), max(1, t.dim_in), max(1, t.dim_out), max(1, t.batch)
    if t.kind == "linear":
        flops = 2.0 * tk * di * do
        moved = (tk * di + di * do + tk * do) * dtype_bytes
    elif t.kind == "attention":
        ctx = max(1, t.context)
        flops = 4.0 * tk * ctx * di
        moved = (2 * tk * di + 2 * b * ctx * do) * dtype_bytes
    elif t.kind == "embedding":
        flops = 0.0
        moved = 2 * tk * do * dtype_bytes
    else:
        per = {"norm": 5, "activation": 4, "softmax": 5}.get(t.kind, 1)
        flops = float(per * tk * do)
        moved = (tk * di + tk * do) * dtype_bytes
    return OpFeatures(t.kind, flops, float(moved), tokens=tk, dim_in=di, dim_out=do, context=t.context,
                      batch=b, dtype_bytes=dtype_bytes)


def layer_chains(timings: Sequence[OpTiming]) -> list[list[OpTiming]]:
    """Group Vidur records into one chain per (device, model, tokens, tp) row, in :data:`LAYER_CHAIN` order.

    Repeated measurements of the same row are kept as separate chains (in file order).
    """
    groups: dict[tuple[str, str, int, int], list[dict[str, OpTiming]]] = {}
    for t in timings:
        if t.op not in LAYER_CHAIN:
            continue
        slots = groups.setdefault((t.device_kind, t.model, t.tokens, t.tp), [])
        for slot in slots:
            if t.op not in slot:
                slot[t.op] = t
                break
        else:
            slots.append({t.op: t})
    return [[slot[op] for op in LAYER_CHAIN if op in slot] for slots in groups.values() for slot in slots]


def chain_p50_ms(chain: Sequence[OpTiming]) -> float:
    return math.fsum(t.p50_ms for t in chain)
