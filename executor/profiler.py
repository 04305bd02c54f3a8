"""CPU operator profiler: times the model family's own operators and writes OpTiming rows.

The sweep covers the shapes of the materialisable built-in configs (``MODEL_CONFIGS`` entries
that are not shape-only): every linear layer at 1..512 tokens, attention prefill (causal, the
context equals the tokens) and decode (one query per sequence against ``context`` keys) at
several contexts and batches, the norm (LayerNorm or RMSNorm), the activation (GELU or SiLU)
and the residual add / gating multiply. Float32, ``torch.set_num_threads(threads)`` while
profiling (restored after). Each point: warm-up calls, then ``repeats`` timed groups of
``inner`` back-to-back calls (``inner`` sized so a group lasts about ``group_s``); the
statistics are over the per-call averages of the groups. Output rows carry
``device_kind="cpu"``, ``tp=1`` and shapes by :class:`~service.core.cost.OpFeatures`
conventions (attention ``context`` = keys attended, ``tokens`` = batch x queries).

The lm_head (vocabulary projection) is profiled only at up to ``LM_HEAD_MAX_TOKENS`` rows:
a serving iteration projects one row per sequence, and at many rows it would dominate the
sweep's time. Reading a large vocabulary's weights is memory-bound, which no smaller linear
shape predicts, so it has to be measured.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from learned.profile import OpTiming, ProfileStore
from service.domain.model_config import MODEL_CONFIGS, ModelConfig

LM_HEAD_MAX_TOKENS = 16
MAX_WEIGHT_COPIES = 32
QUICK_TOKENS: tuple[int, ...] = (1, 4, 16, 64, 128, 256, 512)
FULL_TOKENS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class Sweep:
    """Which shapes to profile and how hard."""

    configs: tuple[str, ...]
    tokens: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    repeats: int = 7
    warmup: int = 2
    group_s: float = 2e-3

    @staticmethod
    def quick() -> Sweep:
        names = tuple(n for n, c in MODEL_CONFIGS.items() if not c.shape_only)
        return Sweep(names, QUICK_TOKENS, (64, 256, 1024), (1, 8), repeats=5, group_s=1e-3)

    @staticmethod
    def full() -> Sweep:
        names = tuple(n for n, c in MODEL_CONFIGS.items() if not c.shape_only)
        return Sweep(names, FULL_TOKENS, (32, 128, 256, 512, 1024), (1, 4, 16))


@dataclass(frozen=True)
class _Point:
    op: str
    kind: str
    model: str
    tokens: int
    dim_in: int
    dim_out: int
    context: int
    batch: int
    make: Callable[[torch.Generator], Callable[[], object]]


def _linear_shapes(c: ModelConfig) -> list[tuple[int, int]]:
    kv = c.n_kv_heads * c.head_dim
    if c.style == "gpt2":
        return [(c.d_model, 3 * c.d_model), (c.d_model, c.d_model), (c.d_model, c.d_ff), (c.d_ff, c.d_model)]
    return [(c.d_model, c.d_model), (c.d_model, kv), (c.d_model, c.d_ff), (c.d_ff, c.d_model)]


def _points(sweep: Sweep) -> list[_Point]:
    pts: dict[tuple[object, ...], _Point] = {}

    def add(p: _Point) -> None:
        pts.setdefault((p.op, p.tokens, p.dim_in, p.dim_out, p.context, p.batch), p)

    for name in sweep.configs:
        c = MODEL_CONFIGS[name]
        weights_bytes = 4 * c.num_params()
        for t in sweep.tokens:
            for k, n in _linear_shapes(c):
                add(_Point("linear", "linear", name, t, k, n, 0, 1, _linear(t, k, n, weights_bytes)))
            if t <= LM_HEAD_MAX_TOKENS:
                add(_Point("lm_head", "linear", name, t, c.d_model, c.vocab_size, 0, 1,
                           _linear(t, c.d_model, c.vocab_size, weights_bytes)))
            norm = "layer_norm" if c.style == "gpt2" else "rms_norm"
            add(_Point(norm, "norm", name, t, c.d_model, c.d_model, 0, 1, _norm(norm, t, c.d_model)))
            act = "gelu" if c.style == "gpt2" else "silu"
            add(_Point(act, "activation", name, t, c.d_ff, c.d_ff, 0, 1, _act(act, t, c.d_ff)))
            add(_Point("add", "elementwise", name, t, c.d_model, c.d_model, 0, 1, _binary(t, c.d_model)))
            if c.style == "llama":
                add(_Point("mul", "elementwise", name, t, c.d_ff, c.d_ff, 0, 1, _binary(t, c.d_ff)))
            if t <= c.max_seq_len:
                add(_Point("sdpa_prefill", "attention", name, t, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                           t, 1, _attention(c, 1, t, t)))
        for b in sweep.decode_batches:
            for ctx in sweep.decode_contexts:
                if ctx <= c.max_seq_len:
                    add(_Point("sdpa_decode", "attention", name, b, c.n_heads * c.head_dim,
                               c.n_kv_heads * c.head_dim, ctx, b, _attention(c, b, 1, ctx)))
    return list(pts.values())


def _linear(t: int, k: int, n: int, working_set_bytes: int) -> Callable[[torch.Generator], Callable[[], object]]:
    """A linear layer whose weights are as cold as in a real forward pass: calls rotate over
    enough weight copies to cycle through the model's weight bytes (capped), so a model larger
    than the last-level cache is timed streaming its weights from memory, as it runs."""
    copies = max(1, min(MAX_WEIGHT_COPIES, math.ceil(working_set_bytes / (4 * k * n))))

    def make(g: torch.Generator) -> Callable[[], object]:
        x = torch.randn(t, k, generator=g)
        ws = [torch.randn(n, k, generator=g) for _ in range(copies)]
        turn = itertools.cycle(ws)
        return lambda: F.linear(x, next(turn))
    return make


def _norm(kind: str, t: int, d: int) -> Callable[[torch.Generator], Callable[[], object]]:
    def make(g: torch.Generator) -> Callable[[], object]:
        x, w = torch.randn(t, d, generator=g), torch.ones(d)
        if kind == "layer_norm":
            b = torch.zeros(d)
            return lambda: F.layer_norm(x, (d,), w, b)
        return lambda: F.rms_norm(x, (d,), w, 1e-5)
    return make


def _act(kind: str, t: int, d: int) -> Callable[[torch.Generator], Callable[[], object]]:
    def make(g: torch.Generator) -> Callable[[], object]:
        x = torch.randn(t, d, generator=g)
        if kind == "gelu":
            return lambda: F.gelu(x, approximate="tanh")
        return lambda: F.silu(x)
    return make


def _binary(t: int, d: int) -> Callable[[torch.Generator], Callable[[], object]]:
    def make(g: torch.Generator) -> Callable[[], object]:
        x, y = torch.randn(t, d, generator=g), torch.randn(t, d, generator=g)
        return lambda: x + y
    return make


def _attention(c: ModelConfig, b: int, t: int, ctx: int) -> Callable[[torch.Generator], Callable[[], object]]:
    def make(g: torch.Generator) -> Callable[[], object]:
        q = torch.randn(b, c.n_heads, t, c.head_dim, generator=g)
        k = torch.randn(b, c.n_kv_heads, ctx, c.head_dim, generator=g)
        v = torch.randn(b, c.n_kv_heads, ctx, c.head_dim, generator=g)
        gqa = c.n_kv_heads != c.n_heads
        causal = t > 1
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return make


def _time(fn: Callable[[], object], sweep: Sweep) -> list[float]:
    """Per-call milliseconds of ``repeats`` groups."""
    for _ in range(sweep.warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(1000, math.ceil(sweep.group_s / one)))
    out: list[float] = []
    for _ in range(sweep.repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) / inner * 1e3)
    return out


def profile_cpu(sweep: Sweep, *, threads: int = 1, seed: int = 0,
                progress: Callable[[int, int], None] | None = None) -> list[OpTiming]:
    """Time every point of ``sweep`` on this CPU; ``progress(done, total)`` after each point."""
    g = torch.Generator().manual_seed(seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[OpTiming] = []
    try:
        points = _points(sweep)
        with torch.inference_mode():
            for i, p in enumerate(points):
                ms = _time(p.make(g), sweep)
                rows.append(OpTiming("cpu", p.model, p.op, p.kind, p.tokens, p.dim_in, p.dim_out, p.context, p.batch,
                                     1, statistics.median(ms), statistics.fmean(ms), statistics.pstdev(ms),
                                     min(ms), max(ms)))
                if progress is not None:
                    progress(i + 1, len(points))
    finally:
        torch.set_num_threads(previous)
    return rows


def profile_main(argv: Sequence[str] | None = None) -> int:
    """``slicesched profile``: time the model family's operators on this CPU into an OpTiming CSV."""
    p = argparse.ArgumentParser(prog="slicesched profile", description=profile_main.__doc__)
    p.add_argument("--out", type=Path, default=Path("artifacts") / "profiles" / "cpu.csv", help="CSV to write")
    p.add_argument("--quick", action="store_true", help="a short sweep (under a minute)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--repeats", type=int, default=None, help="timed groups per shape")
    p.add_argument("--seed", type=int, default=0, help="seed of the input tensors")
    args = p.parse_args(argv)
    sweep = Sweep.quick() if args.quick else Sweep.full()
    if args.repeats is not None:
        sweep = Sweep(sweep.configs, sweep.tokens, sweep.decode_contexts, sweep.decode_batches,
                      repeats=args.repeats, warmup=sweep.warmup, group_s=sweep.group_s)
    started = time.perf_counter()

    def show(done: int, total: int) -> None:
        if done % 50 == 0 or done == total:
            print(f"profiled {done}/{total} shapes ({time.perf_counter() - started:.0f}s)", file=sys.stderr, flush=True)

    rows = profile_cpu(sweep, threads=args.threads, seed=args.seed, progress=show)
    ProfileStore(args.out).save(rows)
    print(f"wrote {len(rows)} rows to {args.out} in {time.perf_counter() - started:.1f}s")
    return 0
