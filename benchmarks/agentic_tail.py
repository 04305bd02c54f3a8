"""agentic_tail: do tail-aware routing with slack priority cut the P99 latency of agentic
workflows against round robin and mean-based routing, does a tail-aware scaler sustain more
throughput at the same SLO than a reactive one, and are the predictors calibrated?

Replay of the three workflow shapes (code generation, deep research, multimodal;
:mod:`service.workload.workflows`, lengths from the Azure 2023 traces and ServeGen mm-image),
for several seeds, in regimes (``--regimes``; each reported under ``results.per_regime``, the
first one's figures also at the top level):

``today``
    8xA100-nvlink, 64 sequences per replica, loads from light to saturated (multiples of
    :data:`service.replay.agentic.BASE_RATES`): the regime of the records so far.
``kv-long``
    8xA100-nvlink at vLLM's default 256 sequences, the conversation pool replaced by the
    Mooncake trace's long documents (most clamp at the 3,500-token cap): KV-bound replicas.
``hetero``
    an A100-80GB, an A40 and an A100 MIG 3g.40gb slice per two tenants (``hetero_cluster`` of
    ``benchmarks/queue_policies.py``, the datasheets' numbers), 256 sequences.

The new regimes run at 0.8x, 1.0x and 1.2x of the cluster's capacity (:func:`capacity_scale`:
the offered work against the devices' speed, by the cost model), the scaling walk at 0.6-1.4x.

1. The predictor is trained first from records of another seed (loads 0.5/1.5/3, each with
   least-loaded and round-robin routing: :func:`service.replay.agentic.record_runs`), then
   adapts online during each tail-aware run (refit every 60 simulated s).
2. Routing, on the container split sized by the run's offered work: ``round-robin/fifo``,
   ``least-loaded/fifo``, ``mean/fifo``, ``tail-argmin/slack`` (the tail router that herds:
   argmin of the prediction over every replica) and ``tail/slack`` (power of two choices with
   the dispatched work counted: :mod:`service.core.router`). Per load, P99 workflow latency of
   each shape; the change of tail/slack against the *better* of round robin and mean routing at
   that load (``min`` of the two P99s), averaged over the shapes.
   ``results.p99_change_vs_best_baseline`` is that change at the highest load where the better
   baseline still meets every shape's SLO at P99 (the load an operator would run it at), median
   over seeds; every load's figure is kept (``per_load``); ``p99_change_vs_least_loaded`` is the
   change against least-loaded routing at the same loads, ``p99_change_vs_tail_argmin`` against
   the herding tail router.
3. Scaling, both starting from one replica per tenant with the rest of the devices free:
   ``tail/slack`` routing with the ``reactive`` (utilisation threshold) or the ``tail`` scaler
   (the predicted tail projected over a new replica's warm-up: engine start-up plus the weight
   copy over the link, :func:`service.replay.agentic.warmup_s`);
   the highest load at which 95% of workflows meet their SLO (interpolated between grid
   loads), and the goodput there. ``results.throughput_at_slo_ratio`` = tail / reactive.
4. ``results.p90_coverage``: share of held-out call latencies (the baseline runs of the
   evaluation seeds) at or below the predicted p90 (target 0.85-0.95); all quantiles and
   targets in ``calibration``.

A plot of P99 (normalised by each shape's SLO, max over shapes) against load per router is
written beside the record (``agentic_tail.png``).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from learned.choice import add_cost_model_argument

ROUTING = (("round-robin", "fifo"), ("least-loaded", "fifo"), ("mean", "fifo"), ("tail-argmin", "slack"),
           ("tail", "slack"))
BASELINES = ("round-robin/fifo", "mean/fifo")  # the headline's "better of the two"
LOADS = (0.5, 1.0, 2.0, 3.0, 3.5)
QUICK_LOADS = (1.0, 3.0)
SCALE_LOADS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
QUICK_SCALE_LOADS = (1.0, 2.0)
ATTAINMENT = 0.95
REGIMES = ("today", "kv-long", "hetero")
# Loads of the new regimes, as multiples of the cluster's capacity (capacity_scale)
CAPACITY_LOADS = (0.8, 1.0, 1.2)
CAPACITY_SCALE = (0.6, 0.8, 1.0, 1.2, 1.4)
QUICK_CAPACITY_SCALE = (0.8, 1.2)
# vLLM's default cap of sequences in a batch (`--max-num-seqs`, 256: vLLM's engine arguments,
# docs.vllm.ai "Engine Arguments"; the simulator's SIM_BATCHING keeps vLLM's defaults too, 256
# sequences and a 2,048-token iteration, the V1 OpenAI server's max_num_batched_tokens on GPUs
# under 70 GiB). Today's regime keeps its 64 (a 13B deployment's own setting).
VLLM_MAX_NUM_SEQS = 256


def sustained(points: list[tuple[float, float, float]], target: float) -> tuple[float, float]:
    """``(load, goodput)`` at the highest load with attainment >= target, linear between the
    bracketing points of ``points`` = sorted ``(load, attainment, goodput)``; 0 if none."""
    best = (0.0, 0.0)
    for (l0, a0, g0), (l1, a1, g1) in itertools.pairwise(points):
        if a0 >= target > a1:
            f = (a0 - target) / (a0 - a1)
            return l0 + (l1 - l0) * f, g0 + (g1 - g0) * f
    ok = [p for p in points if p[1] >= target]
    if ok:
        best = (ok[-1][0], ok[-1][2])
    return best


def regime_setup(name: str, cost_model: Any, seed: int) -> tuple[Any, Any]:
    """``(AgenticConfig, TraceLengths)`` of a regime (see :data:`REGIMES`)."""
    import numpy as np

    from service.replay.agentic import AgenticConfig
    from service.workload.workflows import TraceLengths, trace_lengths

    lengths = trace_lengths()
    if name == "today":
        return AgenticConfig.on("8xA100-nvlink", cost_model, seed=seed, max_num_seqs=64), lengths
    if name == "kv-long":
        from service.replay.binding import read_source

        # Mooncake's long documents stand in for the conversation pool (deep research's
        # questions and reads, the planners' tasks' answers): most clamp at the 3,500-token cap
        moon = np.array([(r.prompt_tokens, r.output_tokens) for r in read_source("mooncake").requests], dtype=np.int64)
        return (AgenticConfig.on("8xA100-nvlink", cost_model, seed=seed, max_num_seqs=VLLM_MAX_NUM_SEQS),
                TraceLengths(lengths.code, moon, lengths.images))
    if name == "hetero":
        from benchmarks.queue_policies import hetero_cluster

        return AgenticConfig(hetero_cluster(), cost_model, seed=seed, max_num_seqs=VLLM_MAX_NUM_SEQS), lengths
    raise ValueError(f"unknown regime {name!r}")


def capacity_scale(config: Any, lengths: Any, *, duration_s: float, seed: int) -> float:
    """Multiple of :data:`~service.replay.agentic.BASE_RATES` at which the offered work equals
    the cluster's: the offered device-seconds per second (the replay's own sizing,
    ``_demands``: prompts as one pass, outputs at a 32-sequence decode's per-token cost, on the
    first device) against every device's speed relative to the first (the cost model's time
    of that decode batch of llama2-7b on it)."""
    from service.domain.model_config import MODEL_CONFIGS
    from service.replay.agentic import _demands, shape_workflows
    from service.sim.iteration import BatchFeatures, IterationCostTable

    wfs = shape_workflows(lengths, 1.0, duration_s=duration_s, seed=seed)
    offered = sum(d.device_s_per_s for d in _demands(config, wfs))
    batch = BatchFeatures.of([], [1024] * 32)

    def time_on(device: Any) -> float:
        return IterationCostTable(MODEL_CONFIGS["llama2-7b"], config.cost_model, device).exact_s(batch)

    ref = time_on(config.cluster.devices[0])
    devices = sum(ref / time_on(d) for d in config.cluster.devices)
    return devices / max(1e-9, offered)


def evaluate(regime: str, config: Any, lengths: Any, *, loads: tuple[float, ...], scale_loads: tuple[float, ...],
             seeds: list[int], duration: float, train_seed: int, epochs: int, started: float) -> dict[str, Any]:
    """Steps 1-4 of the module docstring on one regime."""
    import numpy as np

    from learned.distributional import OnlinePredictor, calibration, fit
    from service.replay.agentic import record_runs, run_agentic, shape_workflows

    slo = {s: c.slo_s for s, c in config.shapes.items()}

    def on_seed(seed: int) -> Any:
        return replace(config, seed=seed)

    # 1. train the predictor from records of other seeds, on this regime's cluster
    calls, tools = record_runs(config, lengths, duration_s=duration, seed=train_seed)
    base = fit(calls, tools, seed=train_seed, epochs=epochs)
    print(f"[{regime}] predictor trained on {len(calls)} calls, {len(tools)} tools "
          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    # 2. routing
    routing: dict[str, Any] = {}
    held_calls, held_tools = [], []
    for seed, load in itertools.product(seeds, loads):
        wfs = shape_workflows(lengths, load, duration_s=duration, seed=seed)
        row: dict[str, Any] = {}
        for router, queue in ROUTING:
            adaptive = OnlinePredictor(base, seed=seed) if router.startswith("tail") else None
            r = run_agentic(on_seed(seed), wfs, router=router, queue=queue, predictor=adaptive or base,
                            adaptive=adaptive, horizon_s=duration, record=router == "round-robin")
            held_calls += r.calls
            held_tools += r.tools
            row[f"{router}/{queue}"] = r.summary()
            print(f"[{regime}] seed {seed} load {load:g} {router}/{queue}: p99 {row[f'{router}/{queue}']['p99_s']:.1f} s"
                  f" ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        routing[f"s{seed}/x{load:g}"] = row

    def change(row: dict[str, Any], baselines: tuple[str, ...] = BASELINES, of: str = "tail/slack"
               ) -> tuple[float, bool]:
        """Mean over shapes of ``of``'s P99 change against the better of ``baselines``; and
        whether that baseline meets every shape's SLO at P99."""
        changes, ok = [], True
        for shape in row[of]["by_shape"]:
            best = min(row[b]["by_shape"][shape]["p99_s"] for b in baselines)
            changes.append(row[of]["by_shape"][shape]["p99_s"] / best - 1.0)
            ok = ok and best <= slo[shape]
        return float(np.mean(changes)), ok

    per_load: dict[str, Any] = {}
    per_load_argmin: dict[str, Any] = {}
    headline, against_ll, herd = [], [], []
    for seed in seeds:
        chosen = None
        for load in loads:
            row = routing[f"s{seed}/x{load:g}"]
            c, ok = change(row)
            per_load.setdefault(f"x{load:g}", []).append(c)
            per_load_argmin.setdefault(f"x{load:g}", []).append(change(row, of="tail-argmin/slack")[0])
            if ok:
                chosen = (load, c)
        if chosen is not None:
            row = routing[f"s{seed}/x{chosen[0]:g}"]
            headline.append(chosen[1])
            against_ll.append(change(row, ("least-loaded/fifo",))[0])
            herd.append(change(row, ("tail-argmin/slack",))[0])

    # 3. scaling
    scaling: dict[str, Any] = {}
    sustained_by: dict[str, list[float]] = {"reactive": [], "tail": []}
    for seed in seeds:
        for scaler in ("reactive", "tail"):
            points = []
            for load in scale_loads:
                wfs = shape_workflows(lengths, load, duration_s=duration, seed=seed)
                adaptive = OnlinePredictor(base, seed=seed)
                r = run_agentic(on_seed(seed), wfs, router="tail", queue="slack", scaler=scaler, predictor=adaptive,
                                adaptive=adaptive, horizon_s=duration)
                s = r.summary()
                scaling[f"s{seed}/{scaler}/x{load:g}"] = s
                points.append((load, s["slo_attainment"], s["goodput_wf_per_s"]))
                print(f"[{regime}] seed {seed} {scaler} load {load:g}: attainment {s['slo_attainment']:.3f} "
                      f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
            sustained_by[scaler].append(sustained(points, ATTAINMENT)[1])
    ratios = [t / r for t, r in zip(sustained_by["tail"], sustained_by["reactive"], strict=True) if r > 0]

    # 4. calibration on held-out records
    cal = calibration(base, held_calls, held_tools)
    p90 = cal["quantiles"].index(0.9)
    return {
        "p99_change_vs_best_baseline": statistics.median(headline) if headline else None,
        # the same load, against least-loaded routing (the cluster's default router)
        "p99_change_vs_least_loaded": statistics.median(against_ll) if against_ll else None,
        # the same load, against the tail router that herds (argmin, no dispatched work counted)
        "p99_change_vs_tail_argmin": statistics.median(herd) if herd else None,
        "throughput_at_slo_ratio": statistics.median(ratios) if ratios else None,
        "p90_coverage": cal["latency_s"][p90] if "latency_s" in cal else None,
        "per_load_p99_change": {k: statistics.median(v) for k, v in per_load.items()},
        "per_load_p99_change_tail_argmin": {k: statistics.median(v) for k, v in per_load_argmin.items()},
        "sustained_goodput_wf_per_s": sustained_by, "loads": list(loads), "scale_loads": list(scale_loads),
        "calibration": cal, "routing": routing, "scaling": scaling,
    }


def main() -> int:
    p = _record.parser("agentic_tail", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seeds", default="0,1,2", help="evaluation seeds (comma-separated)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per run")
    p.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regimes (the first one's figures are "
                   "the top-level keys)")
    add_cost_model_argument(p)
    args = p.parse_args()

    from learned.artifact import load_cost_model
    from service.replay.agentic import RECORD_LOADS, RECORD_ROUTERS

    started = time.perf_counter()
    seeds = [args.seed] if args.quick else [int(s) for s in args.seeds.split(",")]
    duration = 60.0 if args.quick else args.duration
    regimes = [r for r in args.regimes.split(",") if r]
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or not regimes:
        print(f"unknown regime(s) {unknown}; known: {', '.join(REGIMES)}", file=sys.stderr)
        return 2
    cost = load_cost_model(args.cost_model)
    per_regime: dict[str, Any] = {}
    config_regimes: dict[str, Any] = {}
    for name in regimes:
        config, lengths = regime_setup(name, cost.model, args.seed)
        loads: tuple[float, ...]
        scale_loads: tuple[float, ...]
        if name == "today":
            loads = QUICK_LOADS if args.quick else LOADS
            scale_loads = QUICK_SCALE_LOADS if args.quick else SCALE_LOADS
            capacity = None
        else:
            capacity = capacity_scale(config, lengths, duration_s=duration, seed=1000 + args.seed)
            loads = tuple(round(capacity * x, 3) for x in CAPACITY_LOADS)
            scale_loads = tuple(round(capacity * x, 3) for x in (QUICK_CAPACITY_SCALE if args.quick
                                                                  else CAPACITY_SCALE))
        per_regime[name] = evaluate(name, config, lengths, loads=loads, scale_loads=scale_loads, seeds=seeds,
                                    duration=duration, train_seed=1000 + args.seed, epochs=15 if args.quick else 30,
                                    started=started)
        per_regime[name]["capacity_scale_of_base_rates"] = capacity
        config_regimes[name] = {"cluster": config.cluster.name, "max_num_seqs": config.max_num_seqs,
                                "devices": sorted({d.kind for d in config.cluster.devices}),
                                "loads": list(loads), "scale_loads": list(scale_loads)}
    first = per_regime[regimes[0]]
    slo = {s: c.slo_s for s, c in config.shapes.items()}
    plot = _plot(args.out, per_regime, seeds, slo)
    results = {
        "regime": regimes[0],
        **{k: first[k] for k in ("p99_change_vs_best_baseline", "p99_change_vs_least_loaded",
                                 "p99_change_vs_tail_argmin", "throughput_at_slo_ratio", "p90_coverage")},
        "targets": {"p99_change_vs_best_baseline": "<= -0.50", "throughput_at_slo_ratio": ">= 1.5",
                    "p90_coverage": "0.85-0.95"},
        "per_regime": per_regime, "plot": plot,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    config_doc = {"cost_model": cost.kind, "seeds": seeds, "duration_s": duration, "regimes": config_regimes,
                  "attainment": ATTAINMENT,
                  "shapes": {s: {"tenant": c.tenant_id, "model": c.model, "slo_s": c.slo_s}
                             for s, c in config.shapes.items()},
                  "routing": [f"{r}/{q}" for r, q in ROUTING], "predictor_train_seed": 1000 + args.seed,
                  "predictor_train": {"loads": list(RECORD_LOADS), "routers": list(RECORD_ROUTERS)}}
    _record.write("agentic_tail", args, config_doc, results)
    return 0


def _plot(out: Path, per_regime: dict[str, Any], seeds: list[int], slo: dict[str, float]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(per_regime), figsize=(6 * len(per_regime), 4), squeeze=False)
    for ax, (regime, res) in zip(axes[0], per_regime.items(), strict=True):
        loads = res["loads"]
        for router, queue in ROUTING:
            name = f"{router}/{queue}"
            ys = [statistics.median(max(res["routing"][f"s{s}/x{load:g}"][name]["by_shape"][sh]["p99_s"] / slo[sh]
                                        for sh in slo) for s in seeds) for load in loads]
            ax.plot(loads, ys, marker="o", label=name)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("offered load (x base rates)")
        ax.set_ylabel("P99 latency / SLO (worst shape)")
        ax.set_title(f"agentic workflows: {regime}")
        ax.legend(fontsize=7)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "agentic_tail.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path.name)


if __name__ == "__main__":
    sys.exit(main())
