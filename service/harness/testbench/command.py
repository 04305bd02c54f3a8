"""``slicesched testbench``: every queue policy on the live executors, next to the simulator's
prediction of the same runs.

One live stack for the whole bench (:class:`~service.harness.testbench.live.LiveBench`: ``serve`` and one
executor running the model with PyTorch on this CPU), warmed up first, its control plane probed with
lone requests (:meth:`~service.harness.testbench.live.LiveBench.probe_control_plane`); the seeded workload is
drawn once, at ``load`` times the request rate the warm-up measured (or at ``--rate-rps``), and
every policy serves exactly those requests, ``repeats`` times (repeat ``k`` starts its round at
the ``k``-th policy, so a drift of the machine does not always fall on the same policies). Then
the simulator replays the same requests once per policy and prediction
(:mod:`service.harness.testbench.predict`: deterministic; the headline, ``control-plane``, runs the
service's queue and leases around the simulated replica), and :mod:`service.harness.testbench.report` compares. ``DIR`` gets ``testbench.json``
and three plots.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from learned.choice import add_cost_model_argument
from service.domain.error import InvalidInputError
from service.harness.console import print_table
from service.harness.testbench.workload import WorkloadShape

if TYPE_CHECKING:
    from service.core.cost import CostModel
    from service.graph.connection import Neo4jSettings

#: The prediction the record's headline keys (``prediction_ratio``, ``kendall_tau``) judge.
HEADLINE = "control-plane"

#: Every policy the testbench runs, in this order (the registry's names).
POLICIES = ("fifo", "priority", "weighted", "sjf", "aging", "aging-spf", "oracle-remaining", "slack")


@dataclass(frozen=True)
class BenchOptions:
    policies: tuple[str, ...] = POLICIES
    repeats: int = 3
    load: float = 1.2  # offered request rate as a multiple of what the warm-up measured
    rate_rps: float | None = None  # a fixed rate instead (the same workload on every machine)
    shape: WorkloadShape = field(default_factory=lambda: WorkloadShape(duration_s=30.0))
    max_batch: int = 8  # the replica's KV slots (serve --max-batch)
    warm_up_tokens: int = 32  # output tokens of each warm-up request
    seed: int = 0
    cost_model: str | None = None  # the live service's and the simulator's (None: $SLICESCHED_COST_MODEL or learned)

    def __post_init__(self) -> None:
        from service.core.queue import QUEUE_POLICIES

        unknown = [p for p in self.policies if p not in QUEUE_POLICIES]
        if unknown or not self.policies or len(set(self.policies)) != len(self.policies):
            raise InvalidInputError(f"testbench: policies must be distinct registered queue policies "
                                    f"({', '.join(QUEUE_POLICIES)}), got {list(self.policies)}")
        if self.repeats < 1 or not (self.load > 0) or self.max_batch < 1 or self.warm_up_tokens < 1:
            raise InvalidInputError("testbench: repeats, max_batch and warm_up_tokens must be >= 1 and load > 0")
        from service.live.records import LIVE_FAMILIES  # torch: not at CLI start-up

        if self.shape.model not in LIVE_FAMILIES:
            raise InvalidInputError(f"testbench: the executors run {', '.join(LIVE_FAMILIES)}, not "
                                    f"{self.shape.model!r}", culprit=self.shape.model)

    @staticmethod
    def quick(**overrides: Any) -> BenchOptions:
        """The ``--quick`` preset: all policies in a few minutes (shorter arrivals, two repeats)."""
        values: dict[str, Any] = {"repeats": 2, "shape": WorkloadShape(duration_s=10.0)}
        values.update(overrides)
        return BenchOptions(**values)


def policy_params(name: str, token_s: float | None) -> dict[str, float]:
    """Parameters the bench gives a policy: ``slack`` prices a remaining output token at
    ``token_s``, the time per token a request saw in the warm-up with every KV slot busy (the
    others keep their defaults)."""
    return {"token_s": token_s} if name == "slack" and token_s else {}


def run_testbench(opts: BenchOptions, out_dir: Path, *, say: Callable[[str], None] = print,
                  neo4j: Neo4jSettings | None = None, plots: bool = True) -> dict[str, Any]:
    """Run the bench (see the module docstring) on ``neo4j`` (None: the managed server, started if
    needed); writes ``out_dir`` (the plots unless ``plots`` is false) and returns the record."""
    from learned.choice import kind_from
    from service.core.queue import make_queue_policy
    from service.domain.model_config import MODEL_CONFIGS
    from service.graph.connection import Neo4jSettings
    from service.harness.capacity import machine_busy
    from service.harness.live_tenants import reset_tenants
    from service.harness.testbench import report as rep
    from service.harness.testbench.live import LiveBench, LiveRun
    from service.harness.testbench.metrics import Outcome, RunMetrics, run_metrics
    from service.harness.testbench.predict import overheads, predict, predict_control_plane
    from service.harness.testbench.workload import TENANT, bench_workload

    started = time.monotonic()
    kind = kind_from(opts.cost_model)
    if kind == "roofline":  # no artifact: spare the import of the learned models (torch_geometric)
        from learned.roofline import RooflineCostModel

        cost_model: CostModel = RooflineCostModel()
        described: dict[str, Any] = {"kind": kind, "artifact": None, "sha256": None}
    else:
        from learned.artifact import ensure_cost_model, load_cost_model

        ensure_cost_model(kind, progress=say)
        loaded = load_cost_model(kind)
        cost_model, described = loaded.model, loaded.describe()
    neo4j = neo4j or Neo4jSettings.from_env().resolved()
    reset_tenants(neo4j, [TENANT])
    before = machine_busy(sample_s=1.0)
    say(f"testbench: {len(opts.policies)} policies x {opts.repeats} repeats on {opts.shape.model}, "
        f"cost model {kind}; machine load average {before['load_avg_1m']}")
    runs: dict[str, list[LiveRun]] = {p: [] for p in opts.policies}
    with LiveBench(opts.shape.model, neo4j=neo4j, max_batch=opts.max_batch, cost_model=kind, say=say) as bench:
        warm = bench.warm_up(output_tokens=opts.warm_up_tokens)
        control, probes = bench.probe_control_plane()
        say(f"control plane: a lone request joins the batch {1e3 * control.dispatch_s:.0f} ms after it arrives; "
            f"a lease ends {1e3 * control.release_s:.0f} ms after its last token (medians of {control.samples})")
        rate = opts.rate_rps or opts.load * warm.tokens_per_s / opts.shape.mean_output_tokens()
        shape = replace(opts.shape, rate_rps=rate)
        workload = bench_workload(shape, opts.seed, vocab_size=MODEL_CONFIGS[shape.model].vocab_size)
        if opts.rate_rps is None:  # exactly `load` times the measured capacity, whatever the draw gave
            workload = workload.offered_at(opts.load * warm.tokens_per_s)
        shape, rate = workload.shape, workload.shape.rate_rps
        w = workload.summary()
        iteration = f"{1e3 * warm.iteration_s:.1f} ms" if warm.iteration_s else "none reported"
        say(f"warm-up: {warm.tokens_per_s:.0f} output tok/s with {opts.max_batch} KV slots busy, mean iteration "
            f"{iteration}; workload: {w['requests']} requests over {shape.duration_s:.0f}s at {rate:.2f} req/s "
            f"({w['offered_output_tokens_per_s']:.0f} output tok/s offered), digest {str(w['digest'])[:12]}")
        token_s = opts.max_batch / warm.tokens_per_s if warm.tokens_per_s > 0 else None
        n = len(opts.policies)
        for k in range(opts.repeats):
            for j in range(n):
                name = opts.policies[(k + j) % n]
                label = f"repeat {k + 1}/{opts.repeats} {name}"
                run = bench.run(label, name, policy_params(name, token_s), workload)
                runs[name].append(run)
                m = run_metrics(run.outcomes)
                say(f"{label}: {m.tokens_per_s:.0f} tok/s, TTFT p50/p99 {m.ttft_p50_s:.2f}/{m.ttft_p99_s:.2f}s, "
                    f"e2e p50/p99 {m.e2e_p50_s:.2f}/{m.e2e_p99_s:.2f}s ({run.wall_s:.0f}s, load "
                    f"{run.load_avg_1m[1]:.1f})")
        devices = bench.devices
    after = machine_busy(sample_s=1.0)
    say(f"live runs done in {time.monotonic() - started:.0f}s; simulating the same runs")
    overhead = overheads(iteration_s=warm.iteration_s, tokens_per_s=warm.tokens_per_s, max_batch=opts.max_batch)
    predicted: dict[str, dict[str, list[Outcome]]] = {}
    for kind_name, per_iteration_s in overhead.items():
        predicted[kind_name] = {}
        for name in opts.policies:
            policy = make_queue_policy(name, **policy_params(name, token_s))
            predicted[kind_name][name] = predict(workload, policy, devices=devices, cost_model=cost_model,
                                                 max_batch=opts.max_batch, iteration_s=per_iteration_s,
                                                 seed=opts.seed)
    # the headline: the mirror's iterations inside the measured control plane
    predicted[HEADLINE] = {name: predict_control_plane(workload, make_queue_policy(name, **policy_params(name, token_s)),
                                                       devices=devices, cost_model=cost_model, max_batch=opts.max_batch,
                                                       iteration_s=overhead["mirror"], control=control, seed=opts.seed)
                           for name in opts.policies}
    measured: dict[str, list[RunMetrics]] = {p: [run_metrics(r.outcomes) for r in rs] for p, rs in runs.items()}
    comparison = rep.assemble(measured, {k: {p: run_metrics(o) for p, o in per.items()}
                                         for k, per in predicted.items()}, headline=HEADLINE)
    outputs = {r.output_ids_digest for rs in runs.values() for r in rs}
    comparison["reproducibility"]["output_ids_identical"] = len(outputs) == 1
    record: dict[str, Any] = {
        "config": {"options": _jsonable(asdict(opts)), "rate_rps": rate, "slack_token_s": token_s,
                   "cost_model": described,
                   "cluster": {"devices": [list(d) for d in devices], "max_batch": opts.max_batch,
                               "executors": 1, "threads_per_executor": 1}},
        "workload": w,
        "warm_up": asdict(warm),
        "prediction_overhead_s": {**overhead, HEADLINE: overhead["mirror"]},  # per-iteration host overhead
        "control_plane": {"dispatch_s": control.dispatch_s, "release_s": control.release_s, "poll_s": control.poll_s,
                          "samples": control.samples, "probes": probes},
        "machine": {"cores": os.cpu_count(), "before": before, "after": after},
        "live_runs": {p: [{"wall_s": r.wall_s, "max_submit_lag_s": r.max_submit_lag_s, "iteration_s": r.iteration_s,
                           "load_avg_1m": list(r.load_avg_1m)} for r in rs] for p, rs in runs.items()},
        **comparison,
        "plots": ["testbench.png", "testbench_ratio.png", "testbench_cdf.png"],
        "wall_s": time.monotonic() - started,
    }
    if not plots:
        record["plots"] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "testbench.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    if not plots:
        return record
    title = (f"testbench on this CPU: {opts.shape.model}, {w['requests']} requests, {opts.repeats} repeats, "
             f"load avg {after['load_avg_1m']}")
    rep.plot_metrics(out_dir / "testbench.png", comparison, title)
    rep.plot_ratios(out_dir / "testbench_ratio.png", comparison)
    rep.plot_cdfs(out_dir / "testbench_cdf.png", {p: [r.outcomes for r in rs] for p, rs in runs.items()}, predicted)
    return record


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def print_report(record: dict[str, Any]) -> None:
    from service.harness.testbench.metrics import METRICS

    heads = ["policy", "tok/s", "TTFT p50 (s)", "TTFT p99 (s)", "e2e p50 (s)", "e2e p99 (s)"]
    fmt = {m: "{:.0f}" if m == "tokens_per_s" else "{:.2f}" for m in METRICS}
    names = record["predictions"]
    measured, ratios = [], []
    for p in record["policies"]:
        e = record["per_policy"][p]
        cells = [p]
        for m in METRICS:
            v = e["measured"][m]
            cells.append(f"{fmt[m].format(v['median'])} ({fmt[m].format(v['min'])}-{fmt[m].format(v['max'])})")
        measured.append(cells)
        ratios.append([p, *(" / ".join(f"{e['ratio_predicted_over_measured'][n][m]:.2f}" for n in names)
                            for m in METRICS)])
    print_table(heads, measured, title="measured: median over the repeats (min-max)")
    print_table(heads, ratios, title=f"predicted / measured ({' / '.join(names)})")
    for n in names:
        taus = ", ".join(f"{m} {r['kendall_tau']:.2f}" for m, r in record["rank"][n].items())
        print(f"  rank order, measured vs {n} (Kendall tau): {taus}")
    if "prediction_ratio" in record:
        ratios = record["prediction_ratio"]
        print(f"  headline ({record['headline']['prediction']}, {record['headline']['metric']}): predicted / measured "
              f"{min(ratios.values()):.2f}-{max(ratios.values()):.2f} (target 0.8-1.25), Kendall tau "
              f"{record['kendall_tau']:.2f} (target >= 0.8)")
    for note in record["notes"]:
        print(f"  {note}")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("testbench", help="every queue policy on the live executors next to the simulator's prediction")
    p.add_argument("--quick", action="store_true", help="all policies in a few minutes: 10 s of arrivals, 2 repeats")
    p.add_argument("--policies", help=f"comma-separated queue policies (default: {','.join(POLICIES)})")
    p.add_argument("--repeats", type=int, help="runs per policy (default 3; --quick 2)")
    p.add_argument("--duration-s", type=float, help="seconds of arrivals per run (default 30; --quick 10)")
    p.add_argument("--load", type=float, default=1.2,
                   help="offered request rate as a multiple of the rate the warm-up measured (default 1.2)")
    p.add_argument("--rate-rps", type=float, help="a fixed request rate instead of one sized by the warm-up")
    p.add_argument("--model", default="tiny", help="the built-in model the executor runs (default tiny)")
    p.add_argument("--max-batch", type=int, default=8, help="the replica's KV slots (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="testbench-output", help="folder for testbench.json and the plots")
    add_cost_model_argument(p)
    p.set_defaults(func=cmd_testbench)


def options_from(args: argparse.Namespace) -> BenchOptions:
    base = BenchOptions.quick() if args.quick else BenchOptions()
    shape = replace(base.shape, model=args.model, duration_s=args.duration_s or base.shape.duration_s)
    policies: Sequence[str] = base.policies if not args.policies else tuple(
        p.strip() for p in args.policies.split(",") if p.strip())
    return replace(base, policies=tuple(policies), repeats=args.repeats or base.repeats, load=args.load,
                   rate_rps=args.rate_rps, shape=shape, max_batch=args.max_batch, seed=args.seed,
                   cost_model=args.cost_model)


def cmd_testbench(args: argparse.Namespace) -> int:
    opts = options_from(args)
    out = Path(args.out)
    record = run_testbench(opts, out, say=lambda m: print(m, flush=True))
    print()
    print_report(record)
    print(f"\ntestbench finished in {record['wall_s']:.0f}s; report and plots in {out}/ "
          "(testbench.json, testbench.png, testbench_ratio.png, testbench_cdf.png)")
    return 0
