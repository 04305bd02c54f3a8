"""How long do real decode iterations take on this GPU, against the physical floor the cost models are held to?

A Llama-like model from the project's family (:mod:`service.models.family`: Llama-2-7B's layer
shape, ``--layers`` of them, random fp16 weights) runs decode iterations of ``batch`` sequences
at ``context`` cached tokens each, timed with CUDA events after warm-up, each iteration
captured once as a CUDA graph and replayed (so the host's kernel launches do not set the time).
Two attention paths: ``family`` is :class:`~service.models.family.DecoderLM`'s own forward, as
the project's executor runs it (the cache is concatenated with the new token's keys, a copy of
the KV every step); ``static-cache`` writes the new token into a preallocated cache slot and
attends over it in place, as a serving engine does. Each row carries the floor
:func:`service.core.cost.physical_floor_s` computes for the same operators on the device given
by ``--bandwidth-tbs`` and ``--peak-tflops`` (e.g. H200: 4.8 and 989), and the bytes behind it.

Sizes: batch 1/8/32/64/128 x context 512/1000/2000 (under 3 minutes on an H100-class GPU).
``--quick`` runs two tiny sizes of the ``tiny-llama`` config in float32, on the CPU when there
is no GPU (a test of the script, not a measurement). The record goes to ``--out`` (default
``$OUT`` when set, else benchmarks/results).
"""

from __future__ import annotations

import math
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F

from benchmarks._record import parser, write
from service.core.cost import floor_work, physical_floor_s
from service.domain.cluster import Device
from service.models.family import Attention, Block, DecoderLM, ModelConfig, embed_inputs, empty_model, model_config
from service.sim.iteration import BatchFeatures, iteration_ops, kv_bytes_per_token

NAME = "gpu_profile"
BATCHES: tuple[int, ...] = (1, 8, 32, 64, 128)
CONTEXTS: tuple[int, ...] = (512, 1000, 2000)
QUICK_BATCHES: tuple[int, ...] = (1, 4)
QUICK_CONTEXTS: tuple[int, ...] = (16, 48)


def build(config: ModelConfig, device: torch.device, seed: int) -> DecoderLM:
    """The model with random weights drawn on ``device`` (GPT-2-style scale; values do not matter
    for timing, only that they are finite)."""
    model = empty_model(config, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.to(dtype=getattr(torch, config.dtype)).eval()


def static_cache_step(model: DecoderLM, ids: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
                      context: int) -> torch.Tensor:
    """One decode step with the KV written in place: ``cache`` [L, 2, B, Hkv, context + 1, Dh]
    holds ``context`` tokens; the new token goes to slot ``context``."""
    x, rope = embed_inputs(model.embed, None, model.inv_freq, ids, positions)
    assert rope is not None
    for i, block in enumerate(model.blocks):
        assert isinstance(block, Block) and isinstance(block.attn, Attention)
        attn = block.attn
        h = block.attn_norm(x)
        b, t, d = h.shape
        q = attn.q_proj(h).view(b, t, attn.n_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, t, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        cos, sin = rope
        half = attn.head_dim // 2
        q = q * cos + torch.cat([-q[..., half:], q[..., :half]], dim=-1) * sin
        k = k * cos + torch.cat([-k[..., half:], k[..., :half]], dim=-1) * sin
        cache[i, 0, :, :, context:context + 1] = k
        cache[i, 1, :, :, context:context + 1] = v
        y = F.scaled_dot_product_attention(q, cache[i, 0], cache[i, 1], enable_gqa=attn.n_kv_heads != attn.n_heads)
        x = x + attn.o_proj(y.transpose(1, 2).reshape(b, t, d))
        x = x + block.mlp(block.mlp_norm(x))
    out: torch.Tensor = model.lm_head(model.final_norm(x))
    return out


def time_step(step: Any, device: torch.device, *, warmup: int, repeats: int, graph: bool) -> list[float]:
    """Milliseconds of each of ``repeats`` runs of ``step()`` after ``warmup`` runs."""
    if device.type != "cuda":
        for _ in range(warmup):
            step()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as graph capture wants
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    run = step
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
        run()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        run()
        end.record()
        end.synchronize()
        out.append(float(start.elapsed_time(end)))
    return out


def main() -> None:
    p = parser(NAME, __doc__.splitlines()[0])
    p.set_defaults(out=Path(os.environ["OUT"]) if os.environ.get("OUT") else p.get_default("out"))
    p.add_argument("--bandwidth-tbs", type=float, required=True, help="the device's memory bandwidth, TB/s (H200: 4.8)")
    p.add_argument("--peak-tflops", type=float, required=True,
                   help="the device's dense 16-bit peak, TFLOP/s (H200: 989)")
    p.add_argument("--device-kind", default="", help="a label for the record (e.g. H200)")
    p.add_argument("--layers", type=int, default=8, help="layers of Llama-2-7B's shape (default 8)")
    p.add_argument("--repeats", type=int, default=10, help="timed iterations per size")
    p.add_argument("--no-graph", action="store_true", help="time eager launches instead of CUDA graph replays")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if args.quick:
        config = model_config("tiny-llama", dtype="float32" if not cuda else "float16")
        batches, contexts = QUICK_BATCHES, QUICK_CONTEXTS
    else:
        if not cuda:
            p.error("a measurement needs a CUDA device (use --quick to test the script on the CPU)")
        config = model_config("llama2-7b", n_layers=args.layers, dtype="float16", shape_only=False)
        batches, contexts = BATCHES, CONTEXTS
    spec = Device("measured", "measured", args.device_kind or device.type, 0, args.peak_tflops * 1e12,
                  args.bandwidth_tbs * 1e12)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    model = build(config, device, args.seed)
    dtype = getattr(torch, config.dtype)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for context in contexts:
            for batch in batches:
                ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
                positions = torch.full((batch, 1), context, dtype=torch.long, device=device)
                ops = iteration_ops(config, BatchFeatures.of([], [context] * batch))
                moved, flops = floor_work(ops)
                floor_ms = physical_floor_s(ops, spec) * 1e3
                for mode in ("family", "static-cache"):
                    # one cache at a time: at batch 128 x 2,000 tokens one is 34 GB
                    slots = context + (mode == "static-cache")
                    kv = torch.randn((config.n_layers, 2, batch, config.n_kv_heads, slots, config.head_dim),
                                     dtype=dtype, device=device)
                    step = (partial(model, ids, positions, kv_cache=kv) if mode == "family"
                            else partial(static_cache_step, model, ids, positions, kv, context))
                    times = sorted(time_step(step, device, warmup=3, repeats=args.repeats,
                                             graph=cuda and not args.no_graph))
                    del kv, step
                    if cuda:
                        torch.cuda.empty_cache()
                    median = times[len(times) // 2]
                    rows.append({
                        "mode": mode, "batch": batch, "context": context, "measured_ms": median,
                        "measured_min_ms": times[0], "measured_max_ms": times[-1], "floor_ms": floor_ms,
                        "measured_over_floor": median / floor_ms if floor_ms > 0 else math.inf,
                        "floor_bytes": moved, "floor_flops": flops,
                        "kv_read_bytes": kv_bytes_per_token(config) * batch * (context + 1),
                    })
                    print(f"[{NAME}] {mode:<12} batch {batch:4d} context {context:5d}: {median:8.3f} ms "
                          f"(floor {floor_ms:7.3f} ms, {median / floor_ms:5.2f}x)", flush=True)
    dims = {k: v for k, v in config.to_dict().items()
            if k in ("name", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "dtype")}
    config_out = {
        "model": dims, "device": torch.cuda.get_device_name() if cuda else "cpu", "device_kind": args.device_kind,
        "bandwidth_tbs": args.bandwidth_tbs, "peak_tflops": args.peak_tflops, "batches": list(batches),
        "contexts": list(contexts), "repeats": args.repeats, "warmup": 3, "cuda_graph": cuda and not args.no_graph,
        "timing": "torch.cuda.Event around one replay" if cuda else "perf_counter (CPU: a test, not a measurement)",
        "torch": torch.__version__,
    }
    write(NAME, args, config_out, {"rows": rows, "wall_s": time.perf_counter() - started})


if __name__ == "__main__":
    main()
