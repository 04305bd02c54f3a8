"""live_slices: the demo workload on the live stack under container, replica and slice placement: tokens/s within SLA, and what slices cost the owners.

Real processes on loopback, as ``live_e2e``: ``slicesched serve`` (once per placement) and two
executor daemons (``--devices cpu:0,cpu:1`` each, stage servers on) running the models with
PyTorch on this CPU, on one private Neo4j server; one capacity probe sizes the demo's
three-tenant load for this machine, and the same seeded workload is served under each placement
(container first; the others at its pace). ``slice`` is the live ``slice`` policy: whole guest
replicas and sliced guests (layers cut over other tenants' devices, run in their owners' gaps)
judged by the what-if, the sliced plans' slots from the Cypher search over the GMG.

Results are medians over the workload seeds (the repeats): ``slice_over_container`` and
``slice_over_replica`` compare tokens/s within SLA (output tokens of the requests that met their
SLA per second of the run); ``owner_violation_rise_pts`` is the rise, in percentage points, of
the SLA violations of the tenants that lend (all but the saturated one) under slice against
container; ``sliced_guests`` counts the sliced guests placed. ``slice_latency_ape_median``: the
median, over every slice the executors timed in the slice runs (each stage of a lease's prefill
and the decode iteration it timed, on the device it ran on: the GMG's slice observations, owners'
and guests'), of the absolute relative error of the price the live what-if puts on that slice
(the service's cost model, loaded as ``serve`` loads it, priced as the what-if prices a slice:
``benchmarks/_slice_prices.py``) against the measured latency; a fraction, target <= 0.10. The
machine's load average is in the record's ``machine``; on two shared cores these figures are
noise-bound (read the repeats).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

if TYPE_CHECKING:
    from service.graph.connection import Neo4jSettings

PLACEMENTS = ("container", "replica", "slice")
TARGETS = {"slice_over_container": 1.3, "slice_over_replica": 1.1, "owner_violation_rise_pts": 1.0,
           "slice_latency_ape_median": 0.10}


def main() -> int:
    p = _record.parser("live_slices", __doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=120.0, help="seconds of arrivals per placement")
    p.add_argument("--seeds", default="0,1,2", help="workload seeds, comma-separated (the repeats)")
    args = p.parse_args()
    if args.quick:
        args.duration_s = 30.0
    with _record.private_neo4j("slicesched-live-slices-") as neo4j:
        return measure(args, neo4j)


def measure(args: argparse.Namespace, neo4j: Neo4jSettings) -> int:
    """The probe, then the three placements per seed, on ``neo4j``; writes the record."""
    from learned.artifact import load_cost_model
    from service.harness.capacity import calibrate
    from service.harness.live_run import DEMO_TENANTS, compare_placements, demo_workload

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    priced_by = load_cost_model(None)  # what `serve` loads (the same environment): the live what-if's prices
    loads, calibration = calibrate(DEMO_TENANTS, args.duration_s, neo4j=neo4j,
                                   progress=lambda m: print(" ", m, flush=True))
    busy = {t for t, o in calibration.get("offered", {}).items() if o["role"] == "saturated"}
    per_seed = {}
    for i, seed in enumerate(seeds):
        print(f"[{i + 1}/{len(seeds)}] seed {seed}: {', '.join(PLACEMENTS)}, {args.duration_s:.0f}s each", flush=True)
        plots = args.out / "live_slices" / f"seed{seed}"
        record = compare_placements(demo_workload(seed, args.duration_s, loads), plots, neo4j=neo4j, seed=seed,
                                    progress=lambda m: print(" ", m, flush=True), calibration=calibration,
                                    placements=PLACEMENTS)
        (plots / "live.json").unlink()  # the record below holds it
        runs = record["runs"]
        good = {p: r["good_tokens_per_s"] for p, r in runs.items()}
        prices = slice_prices(neo4j, runs["slice"]["started_wall"], priced_by.model)

        def lenders_violations(run: dict[str, Any], busy: set[str] = busy) -> float:
            lenders = [t for t in run["tenants"] if t["tenant_id"] not in busy]
            requests = int(sum(t["requests"] for t in lenders))
            return float(sum(t["sla_violations"] for t in lenders)) / max(1, requests)

        per_seed[f"seed{seed}"] = {
            "good_tokens_per_s": good,
            "tokens_per_s": {p: r["tokens_per_s"] for p, r in runs.items()},
            "sla_violation_rate": record["sla_violation_rate"],
            "slice_over_container": good["slice"] / good["container"] if good["container"] else None,
            "slice_over_replica": good["slice"] / good["replica"] if good["replica"] else None,
            "lender_violation_rate": {p: lenders_violations(r) for p, r in runs.items()},
            "sliced_guests": runs["slice"]["sliced_guests"], "guest_replicas": {p: r["guest_replicas"] for p, r in
                                                                                runs.items()},
            "decisions": runs["slice"]["decisions"], "per_tenant": {p: r["tenants"] for p, r in runs.items()},
            "cpu_cores": {p: r["cpu_cores"] for p, r in runs.items()},
            "plot": f"live_slices/seed{seed}/live_latency.png",
            "timeline_plot": f"live_slices/seed{seed}/live_timeline.png",
            "slice_prices": prices,
            "devices": {p: r["devices"] for p, r in runs.items()},
        }
    rows = list(per_seed.values())

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return float(statistics.median(known)) if known else None

    rise = [100.0 * (r["lender_violation_rate"]["slice"] - r["lender_violation_rate"]["container"]) for r in rows]
    results = {
        "slice_over_container": median([r["slice_over_container"] for r in rows]),
        "slice_over_replica": median([r["slice_over_replica"] for r in rows]),
        "owner_violation_rise_pts": median(list(rise)),
        "slice_latency_ape_median": median([r["slice_prices"]["median_ape"] for r in rows]),
        "slice_latency_priced_by": {"kind": priced_by.kind, "sha256": priced_by.sha256},
        "sliced_guests": sum(r["sliced_guests"] for r in rows),
        "good_tokens_per_s": {p: median([r["good_tokens_per_s"][p] for r in rows]) for p in PLACEMENTS},
        "sla_violation_rate": {p: median([r["sla_violation_rate"][p] for r in rows]) for p in PLACEMENTS},
        "targets": TARGETS,
        "seeds": seeds,
        "per_seed": per_seed,
        "calibration": calibration,
    }
    _record.write("live_slices", args, {"duration_s": args.duration_s, "seeds": seeds, "placements": list(PLACEMENTS),
                                        "executors": 2, "devices_per_executor": 2}, results)
    return 0


def slice_prices(neo4j: Neo4jSettings, since_wall: float, model: Any) -> dict[str, Any]:
    """The live what-if's price of each slice the executors timed since ``since_wall`` (the slice
    run's first arrival; the earlier runs' are gone with their tenants' reset) against what they
    measured: overall, per phase and per family (``_slice_prices.score``), ``median_ape`` as a
    fraction, and the same-shape noise floor of the measurements."""
    from benchmarks._slice_prices import noise_floor, samples_by_group, score
    from service.cli.cost_model import observations_from_gmg

    rows = observations_from_gmg(since_wall, neo4j)
    scored = score(model, samples_by_group(rows))
    return {"observations": len(rows), "priced": scored["n"],
            "median_ape": scored["median_ape_pct"] / 100.0 if scored["median_ape_pct"] is not None else None,
            **{k: v for k, v in scored.items() if k != "points"}, "noise_floor": noise_floor(rows)}


if __name__ == "__main__":
    sys.exit(main())
