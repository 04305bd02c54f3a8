"""replay_headline: does operator-level slice placement beat whole-replica sharing and container
allocation, and how close does it come to a free, clairvoyant ceiling? Also: do the queue
policies and the calibration deliver?

Side by side, same requests for every placement, per tenant mix and seed:

1. ``container`` (static whole devices sized by average load), ``replica`` (guest replicas in
   idle devices), ``slice`` (operator-level slices of backlogged tenants' iterations in other
   tenants' idle windows) and ``oracle-elastic`` (the ceiling: whole devices moved instantly and
   for free to the next interval's true demand). For each, the highest offered load with SLA
   violations <= 9% and <= 5% (a load walk upwards on a fixed grid until violations pass 9%,
   interpolated between the bracketing points), and the token throughput at that load. Mixes:
   ``a100-4tenants`` and ``a100-6tenants`` on 8xA100-nvlink, ``a100-8tenants`` (eight tenants,
   124M to 70B, bursty ServeGen curves) on 2x8xA100; seeds 0, 1, 2 (medians reported, all kept).
2. Saturated: every tenant backlogged (load ``--saturated-load``) for ``--saturated-s``:
   tokens/s of each placement.
3. The same sustained-load figure with one public trace dealt to all tenants of a100-4tenants
   (``--traces``: Azure code, Azure conv, Mooncake), so no result rests on one trace.
4. Queue policies on container at a load where requests queue, and output-length calibration
   (first mix, first seed; as before).

Summary (``results.summary``): ``slice_over_container_4tenants``, ``slice_over_container_8tenants``
(medians over seeds of the sustained-load ratio at 9%), ``slice_over_replica_min`` (smallest
median over the mixes), ``memory_violations`` (total, every run), ``ceiling_share`` (median over
mixes and seeds of slice's gain over container as a share of oracle-elastic's gain).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from learned.choice import add_cost_model_argument

MIXES = {"a100-4tenants": "8xA100-nvlink", "a100-6tenants": "8xA100-nvlink", "a100-8tenants": "2x8xA100"}
PLACEMENTS = ("container", "replica", "slice", "oracle-elastic")
GRID = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)


def sustained(points: list[tuple[float, float, float]], target: float) -> tuple[float, float, bool]:
    """``(load, tokens/s, bracketed)`` at the highest load with violations <= target, linear
    between the bracketing grid points of ``points`` = sorted ``(load, violation, tokens/s)``."""
    best = (0.0, 0.0, False)
    for (l0, v0, t0), (l1, v1, t1) in itertools.pairwise(points):
        if v0 <= target < v1:
            f = (target - v0) / (v1 - v0)
            return l0 + (l1 - l0) * f, t0 + (t1 - t0) * f, True
    if points and points[0][1] <= target:
        last = max(p for p in points if p[1] <= target)
        best = (last[0], last[2], False)  # never crossed: a lower bound
    return best


def main() -> int:
    p = _record.parser("replay_headline", __doc__.splitlines()[0])
    p.add_argument("--duration", type=float, help="simulated seconds per run (default 900; quick 300)")
    p.add_argument("--mixes", default=",".join(MIXES), help="comma-separated tenant mixes")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    p.add_argument("--traces", default="azure-code,azure-conv,mooncake",
                   help="public traces dealt to a100-4tenants' tenants (empty: none)")
    p.add_argument("--saturated-load", type=float, default=4.0)
    p.add_argument("--saturated-s", type=float, help="seconds of the saturated run (default 600; quick 150)")
    p.add_argument("--no-queues", action="store_true", help="skip the queue-policy and calibration part")
    add_cost_model_argument(p)
    args = p.parse_args()
    duration = args.duration or (300.0 if args.quick else 900.0)
    sat_s = args.saturated_s or (150.0 if args.quick else 600.0)
    seeds = [int(x) for x in (args.seeds or "0,1,2").split(",")]
    mixes = [m for m in args.mixes.split(",") if m]
    placements = [x for x in args.placements.split(",") if x]
    traces = [t for t in args.traces.split(",") if t]

    import numpy as np

    from learned.artifact import load_cost_model
    from learned.estimator import calibration_study
    from service.cluster.spec import load_cluster_spec
    from service.domain.request import Workload
    from service.replay.binding import deal, parse_binding, read_source, retime
    from service.replay.context import fit_context
    from service.replay.mix import data_dir, load_mix, sample_workload
    from service.replay.report import plot_latency_cdfs, plot_load_sweep, plot_timeline
    from service.replay.runner import PolicyName, ReplayConfig, run_policy
    from service.workload.readers import read_azure

    cost = load_cost_model(args.cost_model)
    plots = args.out / "replay_headline"
    plots.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    mem_violations = 0

    def run(config: ReplayConfig, workload: Workload, policy: str, load: float, tag: str) -> Any:
        nonlocal mem_violations
        t = time.perf_counter()
        res, spans = run_policy(config, workload, PolicyName.parse(policy), load_scale=load)
        mem_violations += res.memory_violations
        print(f"  {tag:28s} {policy:24s} x{load:<5g} {workload.num_requests:6d} req {res.token_throughput_tps:8.0f} tok/s "
              f"SLA viol {res.sla_violation_rate:6.1%}  moves {res.num_guest_replicas:3d}  "
              f"({time.perf_counter() - t:.0f}s)", flush=True)
        return res, spans

    def walk(config: ReplayConfig, make: Callable[[float], Workload], tag: str, name: str) -> dict[str, Any]:
        """Each placement's load walk, its sustained loads and the plots of one (mix, seed)."""
        out: dict[str, Any] = {}
        all_results = []
        for placement in placements:
            points = []
            spans_mid = None
            for load in GRID:
                res, spans = run(config, make(load), f"fifo/{placement}", load, tag)
                all_results.append(res)
                points.append((load, res.sla_violation_rate, res.token_throughput_tps))
                if res.sla_violation_rate <= 0.09:
                    spans_mid = spans  # the timeline at the highest load within the SLA
                if res.sla_violation_rate > 0.09:
                    break
            at9, at5 = sustained(points, 0.09), sustained(points, 0.05)
            out[placement] = {"sustained_load_9pct": round(at9[0], 4), "tokens_per_s_at_9pct": round(at9[1], 1),
                              "bracketed_9pct": at9[2], "sustained_load_5pct": round(at5[0], 4),
                              "tokens_per_s_at_5pct": round(at5[1], 1), "bracketed_5pct": at5[2],
                              "walk": [{"load": a, "sla_violation": round(b, 4), "tokens_per_s": round(c, 1)}
                                       for a, b, c in points]}
            if spans_mid is not None:
                plot_timeline(plots / f"timeline-{name}-{placement}.png", spans_mid,
                              title=f"{name} {placement}: device timeline (highest load within the SLA)")
        plot_load_sweep(plots / f"load_sweep-{name}.png", all_results)
        return out

    def ratios(r: dict[str, Any]) -> dict[str, float | None]:
        def ratio(a: str, b: str) -> float | None:
            if a in r and b in r and r[b]["sustained_load_9pct"] > 0:
                return round(float(r[a]["sustained_load_9pct"]) / float(r[b]["sustained_load_9pct"]), 3)
            return None
        share = None
        if all(k in r for k in ("slice", "container", "oracle-elastic")):
            gain = r["oracle-elastic"]["sustained_load_9pct"] - r["container"]["sustained_load_9pct"]
            if gain > 0:
                share = round((r["slice"]["sustained_load_9pct"] - r["container"]["sustained_load_9pct"]) / gain, 3)
        return {"slice_over_container": ratio("slice", "container"), "slice_over_replica": ratio("slice", "replica"),
                "replica_over_container": ratio("replica", "container"),
                "oracle_over_container": ratio("oracle-elastic", "container"), "ceiling_share": share}

    per_mix: dict[str, Any] = {}
    saturated: dict[str, Any] = {}
    first: tuple[ReplayConfig, Any] | None = None
    for mix_name in mixes:
        mix = load_mix(mix_name)
        cluster = load_cluster_spec(MIXES.get(mix_name, "8xA100-nvlink"))
        per_seed = {}
        for seed in seeds:
            config = ReplayConfig(cluster, mix, cost.model, seed=seed, duration_s=duration)
            first = first or (config, mix)
            print(f"[{mix_name} seed {seed}] load walk", flush=True)

            def make(load: float, mix: Any = mix, seed: int = seed, d: float = duration) -> Workload:
                return sample_workload(mix, np.random.default_rng(seed), duration_s=d, load_scale=load)[0]

            res = walk(config, make, f"{mix_name} s{seed}", f"{mix_name}-seed{seed}")
            per_seed[str(seed)] = {"placements": res, "ratios": ratios(res)}
        medians = {k: _median([s["ratios"][k] for s in per_seed.values()])
                   for k in ("slice_over_container", "slice_over_replica", "replica_over_container",
                             "oracle_over_container", "ceiling_share")}
        per_mix[mix_name] = {"cluster": cluster.name, "seeds": per_seed, "median": medians}
        # saturated: every tenant backlogged
        config = ReplayConfig(cluster, mix, cost.model, seed=seeds[0], duration_s=sat_s)
        w = sample_workload(mix, np.random.default_rng(seeds[0]), duration_s=sat_s, load_scale=args.saturated_load)[0]
        saturated[mix_name] = {pl: round(run(config, w, f"fifo/{pl}", args.saturated_load, f"{mix_name} saturated")[0]
                                         .token_throughput_tps, 1) for pl in placements}

    per_trace: dict[str, Any] = {}
    base_mix = load_mix("a100-4tenants")
    for trace in traces:
        binding = parse_binding(trace)
        requests = read_source(binding.source).requests
        config = ReplayConfig(load_cluster_spec("8xA100-nvlink"), base_mix, cost.model, seed=seeds[0],
                              duration_s=duration)
        print(f"[trace {trace} dealt to a100-4tenants] load walk", flush=True)

        def make_trace(load: float, requests: Any = requests, source: str = binding.source) -> Workload:
            timed = retime(requests, offset_s=0.0, rate_scale=load, horizon_s=duration)
            fitted, _ = fit_context(deal(timed, base_mix.tenants, "session", source=source), "clamp")
            return Workload(f"a100-4tenants+{source}", fitted, horizon_s=duration)

        res = walk(config, make_trace, f"trace {trace}", f"trace-{trace}")
        per_trace[trace] = {"placements": res, "ratios": ratios(res)}

    queue_summary: dict[str, Any] = {}
    calib: dict[str, Any] = {}
    if not args.no_queues and first is not None:
        config, mix = first
        all_queue = []
        for queue_load in (1.2, 1.5):
            print(f"[queues] queue policies at load x{queue_load:g}", flush=True)
            w = sample_workload(mix, np.random.default_rng(config.seed), duration_s=duration, load_scale=queue_load)[0]
            results = {pol: run(config, w, pol, queue_load, "queues")[0]
                       for pol in ("fifo/container", "sjf/container", "aging-spf/container",
                                   "oracle-remaining/container")}
            all_queue += list(results.values())
            fifo = results["fifo/container"]
            for pol, r in results.items():
                queue_summary[f"{pol} x{queue_load:g}"] = {
                    "e2e_p50_s": round(r.e2e_s["p50"], 3), "e2e_p99_s": round(r.e2e_s["p99"], 3),
                    "median_change": round(r.e2e_s["p50"] / fifo.e2e_s["p50"] - 1, 4),
                    "p99_change": round(r.e2e_s["p99"] / fifo.e2e_s["p99"] - 1, 4),
                    "max_wait_long_s": round(r.max_wait_s_long, 2), "sla_violation": round(r.sla_violation_rate, 4)}
        plot_latency_cdfs(plots / "latency_cdf.png", all_queue)
        print("[calibration] output-length calibration (Azure code -> conv)", flush=True)
        code = read_azure(data_dir() / "azure-llm-2023/AzureLLMInferenceTrace_code.csv", tenant_id="t",
                          model="llama2-7b")
        conv = read_azure(data_dir() / "azure-llm-2023/AzureLLMInferenceTrace_conv.csv", tenant_id="t",
                          model="llama2-7b")
        calib = calibration_study(code.requests, conv.requests)

    def med(mix: str, key: str) -> float | None:
        value = per_mix.get(mix, {}).get("median", {}).get(key)
        return None if value is None else float(value)

    over_replica = [m["median"]["slice_over_replica"] for m in per_mix.values()
                    if m["median"]["slice_over_replica"] is not None]
    shares = [s["ratios"]["ceiling_share"] for m in per_mix.values() for s in m["seeds"].values()
              if s["ratios"]["ceiling_share"] is not None]
    summary = {"slice_over_container_4tenants": med("a100-4tenants", "slice_over_container"),
               "slice_over_container_8tenants": med("a100-8tenants", "slice_over_container"),
               "slice_over_replica_min": min(over_replica) if over_replica else None,
               "memory_violations": mem_violations,
               "ceiling_share": round(statistics.median(shares), 3) if shares else None}
    s4, s8, sr = (summary["slice_over_container_4tenants"], summary["slice_over_container_8tenants"],
                  summary["slice_over_replica_min"])
    _record.write("replay_headline", args, {
        "mixes": {m: MIXES.get(m, "8xA100-nvlink") for m in mixes}, "seeds": seeds, "placements": placements,
        "traces": traces, "duration_s": duration, "grid": list(GRID), "saturated_load": args.saturated_load,
        "saturated_s": sat_s, "cost_model": cost.describe(), "kv": "paged",
    }, {
        "summary": summary,
        "mixes": per_mix,
        "saturated_tokens_per_s": saturated,
        "traces": per_trace,
        "queue_policies": queue_summary,
        "calibration": calib,
        "targets": {"slice_over_container_4tenants_ge_1_5": bool(s4 and s4 >= 1.5),
                    "slice_over_container_8tenants_ge_2_29": bool(s8 and s8 >= 2.29),
                    "slice_over_replica_ge_1_15": bool(sr and sr >= 1.15),
                    "memory_violations_0": mem_violations == 0,
                    "ceiling_share_ge_0_9": bool(summary["ceiling_share"] and summary["ceiling_share"] >= 0.9),
                    "calibration_ge_35pct": bool(calib) and min(calib.get("mae_reduction", 0),
                                                                calib.get("rmse_reduction", 0)) >= 0.35},
        "plots": sorted(str(x.relative_to(args.out)) for x in plots.iterdir()),
        "wall_s": round(time.perf_counter() - started, 1),
    })
    return 0


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


if __name__ == "__main__":
    sys.exit(main())
