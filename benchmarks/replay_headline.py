"""replay_headline: does operator-level slice placement beat container allocation, and do the
queue policies and the calibration deliver, on production-shaped multi-tenant traffic?

One run, side by side, same seed and the same requests for every policy, on ``8xA100-nvlink``
with the ``a100-4tenants`` mix (four tenants, four models from 70B to 124M, three SLA classes,
ServeGen rate curves with Azure conv / code and Mooncake lengths; ``--mix a100-6tenants`` adds
two tenants that are quiet for 300 s and then burst):

1. ``fifo/slice`` against ``fifo/container``: token throughput at equal offered load, and the
   highest load each sustains with SLA violations <= 9% (a load sweep from 0.05x, so that
   both are bracketed; ``sustained_bracketed`` says whether they were).
   Target >= 1.5x, aiming at 2.3x.
2. ``sjf/container`` and ``aging-spf/container`` (both starvation-safe, default parameters; see
   :mod:`service.core.queue`) against ``fifo/container`` at a load where requests queue: change
   of median and P99 end-to-end latency (targets -40% / -15%), and starvation (the worst wait
   of a long request).
3. Calibration: MAE and RMSE reduction of output-length estimates (fit on Azure code, applied
   to Azure conv with online calibration). Target >= 35%.
4. Memory violations of ``slice``: zero.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from learned.choice import add_cost_model_argument

DEFAULT_MIX = "a100-4tenants"


def main() -> int:
    p = _record.parser("replay_headline", __doc__.splitlines()[0])
    p.add_argument("--duration", type=float, help="simulated seconds of traffic per run")
    p.add_argument("--mix", default=DEFAULT_MIX, help="tenant mix (built-in name or file)")
    p.add_argument("--loads", help="comma-separated load multiples of the mix")
    p.add_argument("--queue-loads", default="1.2,1.5",
                   help="loads for the queue-policy comparison (1.2: the coder tenant queues but stays stable; "
                        "1.5: it is overloaded, the starvation check)")
    add_cost_model_argument(p)
    args = p.parse_args()
    # 600 s even when quick: a shorter window misses a100-6tenants' two late tenants, whose
    # ServeGen clients are quiet for the first 300 s and then burst
    duration = args.duration or (600.0 if args.quick else 900.0)
    # low loads too, so the container's sustained load is bracketed on every built-in mix
    loads = [float(x) for x in args.loads.split(",")] if args.loads else (
        [0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 0.75, 1.0] if args.quick
        else [0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5])

    import numpy as np

    from learned.artifact import load_cost_model
    from learned.estimator import calibration_study
    from service.cluster.spec import load_cluster_spec
    from service.replay.mix import data_dir, load_mix, sample_workload
    from service.replay.report import plot_latency_cdfs, plot_load_sweep, plot_timeline
    from service.replay.runner import PolicyName, ReplayConfig, run_policy, sustained_load
    from service.workload.readers import read_azure

    cluster = load_cluster_spec("8xA100-nvlink")
    mix = load_mix(args.mix)
    cost = load_cost_model(args.cost_model)
    config = ReplayConfig(cluster, mix, cost.model, seed=args.seed, duration_s=duration)
    record_name = "replay_headline" if args.mix == DEFAULT_MIX else f"replay_headline-{Path(args.mix).stem}"
    if args.seed:
        record_name += f"-seed{args.seed}"
    plots = args.out / record_name
    plots.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    context: dict[str, dict[str, Any]] = {}  # per load: requests clamped to their model's context

    def run(policy: str, load: float) -> Any:
        w, counts = sample_workload(mix, np.random.default_rng(args.seed), duration_s=duration, load_scale=load)
        context[f"{load:g}"] = {"requests": counts.num_requests, "clamped": counts.clamped,
                                "rejected": counts.rejected}
        t = time.perf_counter()
        res, spans = run_policy(config, w, PolicyName.parse(policy), load_scale=load)
        print(f"  {policy:22s} x{load:<5g} {w.num_requests:6d} req  {res.token_throughput_tps:8.0f} tok/s  "
              f"SLA viol {res.sla_violation_rate:6.1%}  e2e p50 {res.e2e_s['p50']:7.2f}s p99 {res.e2e_s['p99']:7.2f}s  "
              f"guests {res.num_guest_replicas}  ({time.perf_counter() - t:.0f}s)", flush=True)
        return res, spans

    # 1. slice against container over a load sweep
    print("[1/3] slice vs container, load sweep", flush=True)
    sweep: dict[str, list[Any]] = {"fifo/container": [], "fifo/slice": []}
    spans_at_1: dict[str, Any] = {}
    for load in loads:
        for policy in sweep:
            res, spans = run(policy, load)
            sweep[policy].append(res)
            if load == 1.0 or (1.0 not in loads and load == loads[len(loads) // 2]):
                spans_at_1[policy] = spans
    sustained = {pol: sustained_load(rs) for pol, rs in sweep.items()}
    # a sustained load is measured only when the sweep brackets it: the lowest load within 9%
    # and the highest beyond (otherwise it is 0 or the highest load tried, a bound)
    bracketed = {pol: rs[0].sla_violation_rate <= 0.09 < rs[-1].sla_violation_rate for pol, rs in sweep.items()}
    per_load = []
    for c, s in zip(sweep["fifo/container"], sweep["fifo/slice"], strict=True):
        per_load.append({"load": c.load_scale, "container_tps": round(c.token_throughput_tps),
                         "slice_tps": round(s.token_throughput_tps),
                         "throughput_ratio": round(s.token_throughput_tps / max(c.token_throughput_tps, 1e-9), 3),
                         "container_goodput_rps": round(c.goodput_rps, 3), "slice_goodput_rps": round(s.goodput_rps, 3),
                         "goodput_ratio": round(s.goodput_rps / max(c.goodput_rps, 1e-9), 3),
                         "container_sla_violation": round(c.sla_violation_rate, 4),
                         "slice_sla_violation": round(s.sla_violation_rate, 4),
                         "slice_guest_replicas": s.num_guest_replicas, "slice_memory_violations": s.memory_violations})
    sustained_ratio = (sustained["fifo/slice"] / sustained["fifo/container"]
                       if sustained["fifo/container"] and bracketed["fifo/container"] else None)
    for name, spans in spans_at_1.items():
        plot_timeline(plots / f"timeline-{name.replace('/', '-')}.png", spans, title=f"{name}: device timeline")
    plot_load_sweep(plots / "load_sweep.png", [r for rs in sweep.values() for r in rs])

    # 2. queue policies on container: at the mix's load and where requests queue (overload)
    queue_loads = [float(x) for x in args.queue_loads.split(",")]
    queue_summary: dict[str, dict[str, Any]] = {}
    all_queue_results = []
    for queue_load in queue_loads:
        print(f"[2/3] queue policies at load x{queue_load:g}", flush=True)
        known = {r.load_scale: r for r in sweep["fifo/container"]}
        queue_results = {"fifo/container": known.get(queue_load) or run("fifo/container", queue_load)[0]}
        for pol in ("sjf/container", "aging-spf/container", "oracle-remaining/container"):
            queue_results[pol] = run(pol, queue_load)[0]
        all_queue_results += list(queue_results.values())
        fifo = queue_results["fifo/container"]
        for pol, r in queue_results.items():
            queue_summary[f"{pol} x{queue_load:g}"] = {
                "e2e_p50_s": round(r.e2e_s["p50"], 3), "e2e_p99_s": round(r.e2e_s["p99"], 3),
                "median_change": round(r.e2e_s["p50"] / fifo.e2e_s["p50"] - 1, 4),
                "p99_change": round(r.e2e_s["p99"] / fifo.e2e_s["p99"] - 1, 4),
                "max_wait_long_s": round(r.max_wait_s_long, 2), "sla_violation": round(r.sla_violation_rate, 4),
                # the all-tenant P99 is the 70B tenant's decode time (its long answers are the
                # top 1% whatever the order); the queue forms on the prefill-bound coder tenant
                "e2e_by_tenant_s": {t: {"p50": round(v["p50"], 3), "p99": round(v["p99"], 3)}
                                    for t, v in sorted(r.e2e_s_by_tenant.items())},
            }
    plot_latency_cdfs(plots / "latency_cdf.png", all_queue_results)

    # 3. calibration of output-length estimates
    print("[3/3] output-length calibration (Azure code -> conv)", flush=True)
    code = read_azure(data_dir() / "azure-llm-2023/AzureLLMInferenceTrace_code.csv", tenant_id="t", model="llama2-7b")
    conv = read_azure(data_dir() / "azure-llm-2023/AzureLLMInferenceTrace_conv.csv", tenant_id="t", model="llama2-7b")
    calib = calibration_study(code.requests, conv.requests)

    best_ratio = max(x["throughput_ratio"] for x in per_load)
    _record.write(record_name, args, {
        "cluster": cluster.name, "mix": mix.name, "duration_s": duration, "loads": loads,
        "queue_loads": queue_loads, "cost_model": cost.describe(), "interval_s": config.interval_s,
        "kv": config.sim.kv,
        # each tenant's arrivals and lengths: its own trace file (per-tenant) or the mix's generator
        "dealing": "per-tenant" if any(t.trace is not None for t in mix.tenants) else "mix (no trace files)",
        "sources": {t.tenant_id: (t.trace or {"source": "mix"}) for t in mix.tenants},
    }, {
        "context": {"mode": "clamp", "by_load": context},
        "slice_vs_container": {"per_load": per_load, "sustained_load_at_9pct": sustained,
                               "sustained_bracketed": bracketed,
                               "sustained_load_ratio": round(sustained_ratio, 3) if sustained_ratio else None,
                               "best_throughput_ratio": best_ratio,
                               "best_goodput_ratio": max(x["goodput_ratio"] for x in per_load),
                               "slice_memory_violations": sum(r.memory_violations for r in sweep["fifo/slice"])},
        "queue_policies": queue_summary,
        "calibration": calib,
        "targets": {"throughput_ratio_ge_1_5": best_ratio >= 1.5,
                    # a lower bound when the slice's sustained load is not bracketed
                    "sustained_ratio_ge_1_5": bool(sustained_ratio and sustained_ratio >= 1.5),
                    "sjf_median_le_-40pct": any(v["median_change"] <= -0.40 for k, v in queue_summary.items()
                                                if k.startswith("sjf/")),
                    "sjf_p99_le_-15pct": any(v["p99_change"] <= -0.15 for k, v in queue_summary.items()
                                             if k.startswith("sjf/")),
                    # both at one load (the target), for either deployable policy
                    "sjf_both_at_one_load": any(v["median_change"] <= -0.40 and v["p99_change"] <= -0.15
                                                for k, v in queue_summary.items() if k.startswith("sjf/")),
                    "aging_spf_both_at_one_load": any(v["median_change"] <= -0.40 and v["p99_change"] <= -0.15
                                                      for k, v in queue_summary.items()
                                                      if k.startswith("aging-spf/")),
                    "calibration_ge_35pct": min(calib.get("mae_reduction", 0), calib.get("rmse_reduction", 0)) >= 0.35,
                    "slice_zero_memory_violations": sum(r.memory_violations for r in sweep["fifo/slice"]) == 0},
        "plots": sorted(str(x.relative_to(args.out)) for x in plots.iterdir()),
        "wall_s": round(time.perf_counter() - started, 1),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
