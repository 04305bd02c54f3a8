"""testbench: how do the queue policies compare on real execution, and how far is the simulator's prediction of the same runs?

``slicesched testbench`` as a benchmark: one ``slicesched serve`` (on a private Neo4j) and one
executor daemon running the ``tiny`` model with PyTorch on one CPU device, warmed up; every queue
policy (fifo, priority, weighted, sjf, aging, aging-spf, oracle-remaining, slack) serves the same
seeded workload (1.2x the request rate the warm-up measured), repeated; the simulator replays the
same requests on a cluster built as the live what-if mirror builds it, under two calibrations of
its per-iteration overhead (``mirror``: the executor's mean iteration time; ``calibrated``: the
time per iteration the warm-up delivered with every KV slot busy) and, the headline,
``control-plane``: the mirror's iterations inside the live control plane measured on the same stack
(the service's queue and lease grants, a lone request's dispatch delay and a lease's release after
its last token). ``results.prediction_ratio`` (per policy, median completion latency predicted /
measured; target 0.8-1.25) and ``results.kendall_tau`` (its policy ranks; target >= 0.8). Writes
``benchmarks/results/testbench.json`` and the plots into ``benchmarks/results/testbench/``.
``--quick``: 10 s of arrivals and two repeats (all policies in under 10 minutes).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record


def main() -> int:
    p = _record.parser("testbench", __doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, help="runs per policy (default 3; --quick 2)")
    p.add_argument("--load", type=float, default=1.2, help="offered request rate over the warm-up's measured rate")
    args = p.parse_args()

    from service.harness.testbench.command import BenchOptions, run_testbench

    opts = BenchOptions.quick() if args.quick else BenchOptions()
    opts = replace(opts, seed=args.seed, load=args.load, repeats=args.repeats or opts.repeats)
    plots = args.out / "testbench"
    with _record.private_neo4j("slicesched-testbench-") as neo4j:
        record = run_testbench(opts, plots, say=lambda m: print(" ", m, flush=True), neo4j=neo4j)
    (plots / "testbench.json").unlink()  # the record below holds it
    results = {k: record[k] for k in ("policies", "predictions", "headline", "prediction_ratio",
                                      "prediction_ratio_by_metric", "prediction_ratio_within_target", "kendall_tau",
                                      "kendall_tau_by_metric", "targets", "per_policy", "rank", "ratio_range",
                                      "reproducibility", "notes", "workload", "warm_up", "control_plane",
                                      "prediction_overhead_s", "live_runs", "machine", "wall_s")}
    results["plots"] = [f"testbench/{name}" for name in record["plots"]]
    _record.write("testbench", args, record["config"], results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
