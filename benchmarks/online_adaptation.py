"""online_adaptation: does the what-if's cost model learn this machine from what the executors measure? Per-slice MAPE on later, held-out observations, before and after a retrain from the GMG.

Real processes on loopback, as ``live_e2e``: ``slicesched serve`` and two executor daemons
(``--devices cpu:0,cpu:1`` each) running the demo's three tenants with PyTorch on this CPU, on a
private Neo4j server. The cost model starts as the default artifact trained only on GPU profiles
(Vidur's A100, H100 and A40 rows; no CPU row, no ``SLICESCHED_PROFILES``). Two live runs, one
after the other, with different workload seeds (``--seed`` and ``--seed + 1``):

1. the first run's slice observations (each stage of every prefill and the decode iteration
   each lease timed, as the service wrote them on the GMG's Slices) are read back from the GMG
   and the artifact is refitted on them with the function the service's retrainer and
   ``slicesched cost-model train --from-gmg`` run (:func:`learned.observations.train_observed`:
   the GNN refitted on the profiles' samples plus the observations', the model for each observed
   device kind chosen between that GNN and the table on the latest quarter of its observations,
   held out of the fit, and the candidates are that GNN, the table and the kind's rates fitted on
   the same rows, :mod:`learned.rates`);
2. the second run's observations, later and of another workload, are the held-out set: each is
   priced as the what-if prices a slice (its operators with their edges,
   ``ArtifactCostModel.predict_graph``) by the model before and after, against its measured
   latency.

Keys: ``results.mape_before_pct`` and ``results.mape_after_pct`` (target <= 10): the mean
absolute percentage error of the median prediction over the held-out observations; beside them
the median APE, the median signed error, the same per phase and per model family, the counts,
the refit's choice and its evidence, and ``noise_floor_mape_pct``: the MAPE of each held-out
observation against the median of the held-out observations of exactly its shape (model,
phase, layers, batch, tokens, context), the error no predictor of these features can go below
on this machine. The placement is ``slice`` (``--placement``); the demo's fixed mix at
``--rate-scale`` of its rates. A plot of predicted against measured latency, before and after.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from benchmarks._slice_prices import noise_floor, samples_by_group, score

if TYPE_CHECKING:
    from learned.observations import ObservedSlice
    from service.graph.connection import Neo4jSettings

TARGET_MAPE_PCT = 10.0


def main() -> int:
    p = _record.parser("online_adaptation", __doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=60.0, help="seconds of arrivals per live run")
    p.add_argument("--placement", default="slice", choices=("container", "replica", "slice"))
    p.add_argument("--rate-scale", type=float, default=0.6,
                   help="the demo mix's arrival rates times this (0.6: its busy tenant near this machine's capacity)")
    args = p.parse_args()
    if args.quick:
        args.duration_s = 20.0
    if not args.rate_scale > 0:
        p.error("--rate-scale must be > 0")
    with _record.private_neo4j("slicesched-online-adaptation-") as neo4j:
        return measure(args, neo4j)


def live_run(args: argparse.Namespace, neo4j: Neo4jSettings, seed: int, say: Callable[[str], None]
             ) -> tuple[list[ObservedSlice], dict[str, Any]]:
    """One live run of the demo mix; its observations and a summary of the run."""
    from service.cli.cost_model import observations_from_gmg
    from service.harness.live_run import DEMO_TENANTS, demo_workload, run_live

    tenants = [replace(t, rate_rps=t.rate_rps * args.rate_scale) for t in DEMO_TENANTS]
    workload = demo_workload(seed, args.duration_s, tenants)
    since = time.time()
    run = run_live(args.placement, workload, neo4j=neo4j, seed=seed, progress=say)
    rows = observations_from_gmg(since, neo4j)
    summary = {"seed": seed, "requests": workload.num_requests, "unfinished": run.unfinished,
               "tokens_per_s": run.tokens_per_s, "sliced_guests": run.sliced_guests, "cpu_cores": run.cpu_cores, "observations": len(rows),
               "observations_by_phase": {ph: sum(r.phase == ph for r in rows) for ph in ("prefill", "decode")},
               "device_kinds": sorted({r.device_kind for r in rows})}
    return rows, summary


def plot(path: Path, before: dict[str, Any], after: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharex=True, sharey=True)
    for ax, (title, s) in zip(axes, (("before: the GPU-trained artifact", before),
                                     ("after: refitted on the first run's observations", after)), strict=True):
        m, p = s["points"]["measured_ms"], s["points"]["predicted_ms"]
        ax.scatter(m, p, s=8, alpha=0.5)
        lo, hi = min(m + p), max(m + p)
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{title}\nMAPE {s['mape_pct']:.1f}% over {s['n']} held-out slices", fontsize=9)
        ax.set_xlabel("measured slice latency (ms)")
    axes[0].set_ylabel("predicted median (ms)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(args: argparse.Namespace, neo4j: Neo4jSettings) -> int:
    import json

    from learned.artifact import TrainingInputs, default_cache_dir, load_cost_model, train_artifact
    from learned.evaluate import default_data_dir
    from learned.observations import load_observed, observations_file, train_observed
    from service.live.retraining import trace_observed

    def say(message: str) -> None:
        print(" ", message, flush=True)

    inputs = TrainingInputs(default_data_dir(), ())  # GPU profiles only
    cache_dir = default_cache_dir()
    print("[1/4] the base artifact (GPU profiles only)", flush=True)
    train_artifact(inputs, cache_dir, progress=say)
    before = load_cost_model("learned", cache_dir=cache_dir, inputs=inputs)

    print(f"[2/4] live run 1 (seed {args.seed}, {args.placement}, {args.duration_s:.0f}s): observations to learn from",
          flush=True)
    train_rows, run1 = live_run(args, neo4j, args.seed, say)
    say(f"{len(train_rows)} observations from run 1")
    if not train_rows:
        print("no slice observations in the first run: nothing to learn from", file=sys.stderr)
        return 1

    print("[3/4] refit on them (as the service's retrainer does)", flush=True)
    started = time.perf_counter()
    target = train_observed(observations_file(train_rows, cache_dir), inputs, cache_dir, trace_observed,
                            force=True, progress=say)
    train_s = time.perf_counter() - started
    after = load_observed(target)
    meta = json.loads((target / "meta.json").read_text())

    print(f"[4/4] live run 2 (seed {args.seed + 1}): the held-out observations", flush=True)
    held_rows, run2 = live_run(args, neo4j, args.seed + 1, say)
    groups = samples_by_group(held_rows)
    scored_before, scored_after = score(before.model, groups), score(after.model, groups)
    if not scored_before["n"]:
        print("no held-out observation could be priced", file=sys.stderr)
        return 1
    plot_rel = "online_adaptation/online_adaptation.png"
    plot(args.out / plot_rel, scored_before, scored_after)

    def public(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k != "points"}

    kinds = sorted({r.device_kind for r in held_rows})
    results = {
        "mape_before_pct": scored_before["mape_pct"], "mape_after_pct": scored_after["mape_pct"],
        "target_mape_pct": TARGET_MAPE_PCT, "meets_target": scored_after["mape_pct"] <= TARGET_MAPE_PCT,
        "median_ape_before_pct": scored_before["median_ape_pct"],
        "median_ape_after_pct": scored_after["median_ape_pct"],
        "noise_floor_mape_pct": noise_floor(held_rows)["mape_pct"], "noise_floor": noise_floor(held_rows),
        "before": public(scored_before), "after": public(scored_after),
        "model_before": {k: before.choice.get(k, "table") for k in kinds},
        "model_after": {k: after.choice.get(k, "table") for k in kinds},
        "refit": {"observations": meta["observations"], "observed_choice": meta.get("observed_choice"),
                  "seconds": round(train_s, 1), "artifact_sha256": after.sha256, "base_sha256": before.sha256},
        "held_out_observations": len(held_rows), "held_out_priced": scored_before["n"],
        "runs": [run1, run2], "plot": plot_rel,
    }
    print(f"MAPE on {scored_before['n']} held-out slices: before {scored_before['mape_pct']:.1f}%, after "
          f"{scored_after['mape_pct']:.1f}% (target {TARGET_MAPE_PCT:.0f}%; same-shape noise floor "
          f"{results['noise_floor_mape_pct']}%)", flush=True)
    _record.write("online_adaptation", args, {"duration_s": args.duration_s, "placement": args.placement,
                                              "rate_scale": args.rate_scale, "seeds": [args.seed, args.seed + 1],
                                              "executors": 2, "devices_per_executor": 2,
                                              "base_inputs": {"data_dir": str(inputs.data_dir), "profiles": [],
                                                              "key": inputs.key()}}, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
