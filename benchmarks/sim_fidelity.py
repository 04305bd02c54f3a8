"""sim_fidelity: how closely does the simulator predict real continuous-batching runs?

For each model (``tiny``, ``gpt2-small``) on this CPU:

1. profile the model's operators with the executor's profiler (the CPU profile the simulator's
   cost model is built from: ``ProfileTableCostModel``);
2. measure the batcher's capacity on this machine now: the calibration requests all at once,
   requests finished per wall second (``capacity_rps``); the workloads below arrive at
   ``UTILISATION`` of it, so the case measures the same regime (requests that queue a little, a
   batch that fills) on a quiet machine and a busy one: a fixed rate meant a queue that grew on a
   busy machine and a batch of one or two on a quiet one;
3. run a *calibration* workload for real (``executor.batcher.ContinuousBatcher``, wall-clock
   arrivals) and fit the host-side iteration overhead (fixed + per prefilled sequence + per
   decode, each >= 0: a non-negative least-squares fit) on what the operator profile does not
   explain;
4. run a different *evaluation* workload (another seed) for real, and simulate the same
   workload with ``SimulatedCluster`` on the ``local-cpu-2`` device with the same batching limits;
5. compare measured and predicted iteration latencies (each measured batch priced by the cost
   model) and end-to-end request latencies (simulated run against real run).

Target (Vidur reports < 9% on GPUs): median absolute error of end-to-end latency <= 10%.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

MODELS = {
    # name: (requests quick, requests full, max batch)
    "tiny": (60, 200, 8),
    "gpt2-small": (12, 32, 8),
}
UTILISATION = 0.7  # arrivals at this share of the measured capacity
SHAPE_RATE = 1.0  # the synthetic workload's rate before it is rescaled to UTILISATION x capacity


@dataclass
class RealRun:
    iterations: list[Any]
    e2e_s: dict[str, float]
    ttft_s: dict[str, float]
    wall_s: float


def workload(model: str, n: int, rate: float, seed: int) -> Any:
    import numpy as np

    from service.workload.synthetic import TenantLoad, synthetic_workload

    load = TenantLoad("fidelity", model, rate_rps=rate, prompt_median_tokens=40, prompt_sigma=0.6,
                      prompt_max_tokens=160, output_median_tokens=16, output_sigma=0.5, output_max_tokens=48)
    w = synthetic_workload(np.random.default_rng(seed), tenants=[load], duration_s=4 * n / rate)
    return w.head(n)


def run_real(model_name: str, wl: Any, max_batch: int, seed: int) -> RealRun:
    import torch

    from executor.batcher import ContinuousBatcher, GenerationRequest
    from service.domain.model_config import model_config
    from service.models.family import build_model

    model = build_model(model_config(model_name), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    batcher = ContinuousBatcher(model, max_batch=max_batch, max_context=256)
    # One untimed warm-up request: first calls allocate and pick kernels.
    batcher.submit(GenerationRequest("warmup", [1] * 32, 4))
    while not batcher.idle:
        batcher.step()
    batcher.finished.clear()
    batcher.iterations.clear()

    pending = deque(wl.requests)
    arrivals: dict[str, float] = {}
    t0 = time.perf_counter()
    while pending or not batcher.idle:
        now = time.perf_counter() - t0
        while pending and pending[0].arrival_s <= now:
            r = pending.popleft()
            prompt = torch.randint(0, vocab, (r.prompt_tokens,), generator=gen).tolist()
            arrivals[r.request_id] = t0 + r.arrival_s
            batcher.submit(GenerationRequest(r.request_id, prompt, r.output_tokens, arrival_s=t0 + r.arrival_s))
        if batcher.idle:
            time.sleep(max(0.0, pending[0].arrival_s - (time.perf_counter() - t0)))
            continue
        batcher.step()
    wall = time.perf_counter() - t0
    e2e = {r.request_id: r.finished_s - arrivals[r.request_id] for r in batcher.finished}  # type: ignore[operator]
    ttft = {r.request_id: r.first_token_s - arrivals[r.request_id] for r in batcher.finished}  # type: ignore[operator]
    return RealRun(list(batcher.iterations), e2e, ttft, wall)


def batch_of(it: Any) -> Any:
    from service.sim.iteration import BatchFeatures

    return BatchFeatures.of([(n, 0) for n in it.prefill_tokens], list(it.decode_contexts))


def nonnegative_lstsq(x: Any, y: Any) -> Any:
    """argmin ||x c - y|| over c >= 0, exactly, for a few columns: the best unconstrained fit on
    every subset of columns whose coefficients all come out >= 0 (clipping an unconstrained fit
    instead leaves the other coefficients fitted to a term that was dropped)."""
    import itertools

    import numpy as np

    best, best_err = np.zeros(x.shape[1]), float(np.sum(y ** 2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            sub, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(sub < 0):
                continue
            coef = np.zeros(x.shape[1])
            coef[list(cols)] = sub
            err = float(np.sum((x @ coef - y) ** 2))
            if err < best_err:
                best, best_err = coef, err
    return best


def fit_overhead(iterations: list[Any], table: Any) -> Any:
    """Non-negative least squares of (measured - operator prediction) on [1, prefill seqs, decodes]."""
    import numpy as np

    from service.core.cost import IterationOverhead

    x = np.array([[1.0, len(it.prefill_tokens), len(it.decode_contexts)] for it in iterations])
    y = np.array([it.duration_s - table.exact_s(batch_of(it)) for it in iterations])
    coef = nonnegative_lstsq(x, y)
    return IterationOverhead(float(coef[0]), float(coef[1]), float(coef[2]), separate_prefill_passes=True)


def capacity_rps(model_name: str, wl: Any, max_batch: int, seed: int) -> float:
    """Requests per wall second when every request of ``wl`` arrives at once (the batch kept full)."""
    from dataclasses import replace

    from service.domain.request import Workload

    burst = Workload(f"{wl.name}-burst", [replace(r, arrival_s=0.0) for r in wl.requests])
    run = run_real(model_name, burst, max_batch, seed)
    return len(run.e2e_s) / run.wall_s


def ape(pred: float, real: float) -> float:
    return abs(pred - real) / real


def evaluate_model(name: str, args: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    from executor.profiler import Sweep, profile_cpu
    from learned.table import ProfileTableCostModel
    from service.cluster.spec import load_cluster_spec
    from service.core.cost import IterationOverhead
    from service.domain.model_config import model_config
    from service.sim.cluster import ReplicaSpec, SimulatedCluster
    from service.sim.iteration import IterationCostTable

    n_quick, n_full, max_batch = MODELS[name]
    n = n_quick if args.quick else n_full
    torch.set_num_threads(args.threads)
    config = model_config(name)
    device = next(d for d in load_cluster_spec("local-cpu-2").devices if d.device_id == "cpu:0")

    started = time.perf_counter()
    sweep = Sweep((name,), (1, 2, 4, 8, 16, 32, 64, 128, 256), (16, 32, 64, 128, 256), (1, 2, 4, 8),
                  repeats=5 if args.quick else 9)
    rows = profile_cpu(sweep, threads=args.threads, seed=args.seed)
    print(f"[{name}] profiled {len(rows)} operator shapes in {time.perf_counter() - started:.0f}s", flush=True)
    ops_model = ProfileTableCostModel.from_timings(rows, dtype_bytes=4)
    # The batcher runs each prompt as its own forward pass: price iterations that way.
    ops_only = IterationCostTable(config, ops_model, device,
                                  overhead=IterationOverhead(separate_prefill_passes=True))

    shape = workload(name, n, SHAPE_RATE, args.seed + 100)
    capacity = capacity_rps(name, shape, max_batch, args.seed)
    rate = UTILISATION * capacity
    print(f"[{name}] capacity {capacity:.1f} requests/s (all at once); arrivals at {rate:.1f}/s", flush=True)
    calib = run_real(name, shape.scaled(rate / SHAPE_RATE), max_batch, args.seed)
    overhead = fit_overhead(calib.iterations, ops_only)
    print(f"[{name}] calibration run: {len(calib.iterations)} iterations in {calib.wall_s:.1f}s; overhead "
          f"{overhead.per_iteration_s * 1e3:.2f} ms/iter + {overhead.per_prefill_seq_s * 1e3:.2f} ms/prefill + "
          f"{overhead.per_decode_s * 1e3:.3f} ms/decode", flush=True)

    wl = workload(name, n, SHAPE_RATE, args.seed).scaled(rate / SHAPE_RATE)
    real = run_real(name, wl, max_batch, args.seed)
    print(f"[{name}] evaluation run: {len(real.e2e_s)} requests, {len(real.iterations)} iterations in "
          f"{real.wall_s:.1f}s", flush=True)

    full = IterationCostTable(config, ops_model, device, overhead=overhead)
    iter_ape = [ape(full.exact_s(batch_of(it)), it.duration_s) for it in real.iterations]
    iter_ape_ops_only = [ape(ops_only.exact_s(batch_of(it)), it.duration_s) for it in real.iterations]

    def simulate(with_overhead: bool) -> dict[str, Any]:
        spec = load_cluster_spec("local-cpu-2")
        replica = ReplicaSpec("r0", name, ("cpu:0",), max_batched_tokens=2048, max_num_seqs=max_batch)
        cluster = SimulatedCluster(spec, [replica], ops_model, rng=np.random.default_rng(args.seed),
                                   overheads={name: overhead if with_overhead else
                                              IterationOverhead(separate_prefill_passes=True)})
        cluster.submit(wl)
        cluster.run()
        return {o.request_id: o for o in cluster.report().requests}

    sim = simulate(True)
    sim_ops_only = simulate(False)
    ids = sorted(real.e2e_s)
    e2e_ape = [ape(sim[i].e2e_s, real.e2e_s[i]) for i in ids]
    e2e_ape_ops_only = [ape(sim_ops_only[i].e2e_s, real.e2e_s[i]) for i in ids]
    ttft_ape = [ape(sim[i].ttft_s, real.ttft_s[i]) for i in ids]
    real_iter_med = statistics.median(it.duration_s for it in real.iterations)
    return {
        "requests": len(ids), "iterations": len(real.iterations), "max_batch": max_batch,
        "capacity_rps": round(capacity, 2), "utilisation": UTILISATION, "rate_rps": round(rate, 2),
        "mean_decode_batch": statistics.fmean(len(it.decode_contexts) for it in real.iterations),
        "real_iteration_ms_median": round(real_iter_med * 1e3, 3),
        "overhead_ms": {"per_iteration": overhead.per_iteration_s * 1e3,
                        "per_prefill_seq": overhead.per_prefill_seq_s * 1e3, "per_decode": overhead.per_decode_s * 1e3},
        "iteration_ape_median": round(statistics.median(iter_ape), 4),
        "iteration_mape": round(statistics.fmean(iter_ape), 4),
        "iteration_ape_median_ops_only": round(statistics.median(iter_ape_ops_only), 4),
        "e2e_ape_median": round(statistics.median(e2e_ape), 4),
        "e2e_ape_p90": round(float(np.quantile(e2e_ape, 0.9)), 4),
        "e2e_ape_median_ops_only": round(statistics.median(e2e_ape_ops_only), 4),
        "ttft_ape_median": round(statistics.median(ttft_ape), 4),
        "real_e2e_s_median": round(statistics.median(real.e2e_s.values()), 4),
        "sim_e2e_s_median": round(statistics.median(sim[i].e2e_s for i in ids), 4),
        "meets_target": statistics.median(e2e_ape) <= 0.10,
    }


def main() -> int:
    p = _record.parser("sim_fidelity", __doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--threads", type=int, default=1, help="torch threads for profiling and real runs")
    args = p.parse_args()
    results = {}
    for name in args.models:
        results[name] = evaluate_model(name, args)
        r = results[name]
        print(f"[{name}] end-to-end median error {r['e2e_ape_median']:.1%} (operator profile alone "
              f"{r['e2e_ape_median_ops_only']:.1%}); iteration median error {r['iteration_ape_median']:.1%}",
              flush=True)
    worst = max(r["e2e_ape_median"] for r in results.values())
    _record.write("sim_fidelity", args, {"models": args.models, "threads": args.threads, "utilisation": UTILISATION,
                                         "cluster": "local-cpu-2 (cpu:0)"},
                  {"per_model": results, "worst_e2e_ape_median": worst, "target_e2e_ape_median": 0.10,
                   "meets_target": worst <= 0.10 and not math.isnan(worst)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
