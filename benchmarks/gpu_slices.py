"""How much longer does an owner's decode iteration take while another tenant's slices run beside it on a low-priority CUDA stream?

The owner: decode iterations (``--batch`` sequences at ``--context`` cached tokens) of a
Llama-2-7B-shaped model of ``--layers`` layers in fp16 (the project's family,
:mod:`service.models.family`), timed with CUDA events on its own stream. The guest: prefill
micro-batches (``--guest-tokens`` tokens) through another Llama-2-7B-shaped model's layers, run
layer by layer by the executor's slice code (:class:`executor.slices.SliceLayers`), launched
from a second thread as fast as the GPU takes them (the worst case for the owner: a guest
always ready).

Four phases of ``--seconds`` each: the owner alone; the guest on the same stream as the owner
(one queue, as without streams); the guest on a separate stream of the same priority; the guest
on the least priority and the owner on the greatest (:class:`executor.slices.StreamSelector`,
as the executor runs them). Results: the owner's median and p90 iteration time per phase, its
slowdown against alone, and the guest's layers per second.

Under 60 s of GPU time at the defaults (4 phases x 8 s, plus the build). ``--quick`` runs tiny
models briefly, on the CPU when there is no GPU (a test of the script, not a measurement). The
record goes to ``--out`` (default ``$OUT`` when set, else benchmarks/results).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from benchmarks._record import parser, write
from benchmarks.gpu_profile import build  # the same random-weight model the profile times
from executor.slices import SliceAssignment, SliceLayers, StreamSelector
from service.models.family import DecoderLM, model_config

NAME = "gpu_slices"
PHASES = ("alone", "same_stream", "equal_priority", "low_priority")


class Guest:
    """A thread running the guest's slices back to back on ``stream`` (``None``: the current stream)."""

    def __init__(self, layers: SliceLayers, assignment: SliceAssignment, stream: Any, device: torch.device) -> None:
        self.layers, self.assignment, self.stream, self.device = layers, assignment, stream, device
        self.layers_run = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guest", daemon=True)

    def _run(self) -> None:
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else _Null()
        with ctx, torch.inference_mode():
            while not self._stop.is_set():
                state = self.layers.begin(self.assignment)
                while not state.done and not self._stop.is_set():
                    self.layers.advance(state)
                    self.layers_run += 1
                if self.device.type == "cuda":  # bound the queue ahead of the GPU: one slice at a time
                    torch.cuda.current_stream(self.device).synchronize()

    def __enter__(self) -> Guest:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def owner_iterations(model: DecoderLM, cache: torch.Tensor, batch: int, context: int, seconds: float,
                     stream: Any, device: torch.device) -> list[float]:
    """Owner decode iterations for ``seconds``: each one's time in seconds (CUDA events on its
    stream; the wall clock on the CPU)."""
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    pos = torch.full((batch, 1), context, dtype=torch.long, device=device)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    ctx = torch.cuda.stream(stream) if stream is not None else _Null()
    with ctx, torch.inference_mode():
        while time.perf_counter() < deadline:
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                model(ids, pos, kv_cache=cache, last_logits_only=True)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                model(ids, pos, kv_cache=cache, last_logits_only=True)
                times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = parser(NAME, __doc__.splitlines()[0] if __doc__ else NAME)
    p.set_defaults(out=Path(os.environ["OUT"]) if os.environ.get("OUT") else p.get_default("out"))
    p.add_argument("--layers", type=int, default=8, help="layers of each Llama-2-7B-shaped model")
    p.add_argument("--batch", type=int, default=32, help="the owner's decode batch")
    p.add_argument("--context", type=int, default=1024, help="the owner's cached tokens per sequence")
    p.add_argument("--guest-tokens", type=int, default=1024, help="tokens of the guest's prefill micro-batch")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda and not args.quick:
        p.error("a measurement needs a CUDA device (use --quick to test the script on the CPU)")
    if args.quick:
        config = model_config("tiny-llama")
        args.batch, args.context, args.guest_tokens, args.seconds = 4, 32, 64, 0.5
    else:
        config = model_config("llama2-7b", n_layers=args.layers, shape_only=False)
    torch.manual_seed(args.seed)
    owner = build(config, device, args.seed)
    guest_model = build(config, device, args.seed + 1)
    guest_layers = SliceLayers(config, nn.ModuleList(guest_model.blocks), 1, 1 + config.n_layers, device)
    del guest_model
    dtype = getattr(torch, config.dtype)
    hidden = torch.randn(1, args.guest_tokens, config.d_model, device=device, dtype=dtype)
    assignment = SliceAssignment("bench", config.name, 1, 1 + config.n_layers, str(device), hidden=hidden)
    cache = torch.randn(config.n_layers, 2, args.batch, config.n_kv_heads, args.context, config.head_dim,
                        device=device, dtype=dtype) * 0.1
    streams = StreamSelector()
    owner_high = streams.stream(device, "owner")
    guest_low = streams.stream(device, "guest")
    shared = torch.cuda.Stream(device=device) if cuda else None  # type: ignore[no-untyped-call]
    other = torch.cuda.Stream(device=device) if cuda else None  # type: ignore[no-untyped-call]
    plan: dict[str, tuple[Any, Any]] = {  # phase -> (owner stream, guest stream or "none")
        "alone": (shared, "none"), "same_stream": (shared, shared), "equal_priority": (shared, other),
        "low_priority": (owner_high, guest_low)}
    owner_iterations(owner, cache, args.batch, args.context, min(1.0, args.seconds), shared, device)  # warm-up
    results: dict[str, Any] = {"phases": {}}
    for phase in PHASES:
        owner_stream, guest_stream = plan[phase]
        if guest_stream == "none":
            times, rate = owner_iterations(owner, cache, args.batch, args.context, args.seconds, owner_stream,
                                           device), 0.0
        else:
            with Guest(guest_layers, assignment, guest_stream, device) as g:
                t0 = time.perf_counter()
                times = owner_iterations(owner, cache, args.batch, args.context, args.seconds, owner_stream, device)
                rate = g.layers_run / (time.perf_counter() - t0)
        times.sort()
        results["phases"][phase] = {"owner_iterations": len(times), "owner_median_s": statistics.median(times),
                                    "owner_p90_s": times[max(0, math.ceil(0.9 * len(times)) - 1)], "guest_layers_per_s": rate}
    alone = results["phases"]["alone"]["owner_median_s"]
    for phase in PHASES:
        results["phases"][phase]["owner_slowdown"] = results["phases"][phase]["owner_median_s"] / alone
    results["low_priority_slowdown"] = results["phases"]["low_priority"]["owner_slowdown"]
    results["same_stream_slowdown"] = results["phases"]["same_stream"]["owner_slowdown"]
    results["priorities"] = {"owner": streams.priority("owner") if cuda else None,
                             "guest": streams.priority("guest") if cuda else None}
    write(NAME, args, {"model": config.name, "layers": config.n_layers, "dtype": config.dtype, "batch": args.batch,
                       "context": args.context, "guest_tokens": args.guest_tokens, "seconds": args.seconds,
                       "device": torch.cuda.get_device_name(device) if cuda else "cpu"}, results)


if __name__ == "__main__":
    main()
