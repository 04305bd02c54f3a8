"""``slicesched replay``: replay a workload against policies and write a report with plots.

Everything is validated before anything runs (policies, cluster, mix, trace, that the cluster
can hold the mix's models), and ``DIR`` is written only at the end (report and plots land
together in a temporary folder first), so a bad input leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from learned.choice import add_cost_model_argument
from service.console import print_table
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload


def add_parser(sub: Any) -> None:
    p = sub.add_parser("replay", help="replay a workload against queue/placement policies on a simulated cluster")
    p.add_argument("--trace", default="synthetic",
                   help="'synthetic' (the mix's own arrivals and lengths) or an Azure CSV / Mooncake JSONL file "
                        "whose requests are dealt to the mix's tenants")
    p.add_argument("--cluster", default="8xA100-nvlink", help="built-in cluster spec or a YAML/JSON file")
    p.add_argument("--tenants", default="a100-4tenants", help="built-in tenant mix or a YAML/JSON file")
    p.add_argument("--policy", action="append", default=[], metavar="QUEUE/PLACEMENT",
                   help="e.g. fifo/container, sjf/slice (repeatable; default fifo/container and fifo/slice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, help="seconds of trace to replay (default: the mix's)")
    p.add_argument("--load", type=float, default=1.0, help="offered load as a multiple of the mix's rates")
    p.add_argument("--load-sweep", help="comma-separated load multiples, e.g. 0.5,1,1.5,2")
    p.add_argument("--interval", type=float, default=5.0, help="scheduling step in simulated seconds")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed trace rows (counted and reported)")
    p.add_argument("--out", required=True, help="output folder (report.json and plots)")
    p.add_argument("--record", action="store_true", help="also write the run and its results to Neo4j")
    add_cost_model_argument(p)
    p.set_defaults(func=run)


def _deal(trace: list[RequestSpec], mix: Any, horizon_s: float) -> Workload:
    """Deal a trace's requests to the mix's tenants in turn (each keeps its model and SLA class)."""
    tenants = mix.tenants
    out = []
    for i, r in enumerate(x for x in trace if x.arrival_s < horizon_s):
        t = tenants[i % len(tenants)]
        out.append(RequestSpec(f"{t.tenant_id}:{i}", t.tenant_id, t.model, r.arrival_s, r.prompt_tokens,
                               r.output_tokens, t.sla_class, r.prefix_hashes))
    return Workload(f"{mix.name}+trace", out, horizon_s=horizon_s)


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from learned.artifact import load_cost_model
    from service.cluster.spec import load_cluster_spec
    from service.replay.mix import build_workload, load_mix
    from service.replay.report import plot_latency_cdfs, plot_load_sweep, plot_timeline
    from service.replay.runner import PolicyName, ReplayConfig, check_fits, run_policy, sustained_load
    from service.workload.readers import read_trace

    policies = [PolicyName.parse(p) for p in (args.policy or ["fifo/container", "fifo/slice"])]
    cluster = load_cluster_spec(args.cluster)
    mix = load_mix(args.tenants)
    check_fits(cluster, mix)
    try:
        loads = [float(x) for x in args.load_sweep.split(",")] if args.load_sweep else [args.load]
    except ValueError:
        raise InvalidInputError(f"--load-sweep expects numbers separated by commas, got {args.load_sweep!r}") from None
    if any(not x > 0 for x in loads):
        raise InvalidInputError("loads must be positive")
    if args.duration is not None and not args.duration > 0:
        raise InvalidInputError("--duration must be positive")
    cost = load_cost_model(args.cost_model)
    config = ReplayConfig(cluster, mix, cost.model, seed=args.seed, duration_s=args.duration,
                          interval_s=args.interval)
    trace = None
    bad_lines = 0
    if args.trace != "synthetic":
        result = read_trace(args.trace, "auto", skip_bad=args.skip_bad)
        trace, bad_lines = result.requests, result.num_bad
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {out} exists and is not a folder")

    started = time.perf_counter()
    results = []
    timelines: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn()) as bar:
        for load in loads:
            if trace is None:
                workload = build_workload(mix, np.random.default_rng(args.seed), duration_s=config.horizon_s,
                                          load_scale=load)
            else:
                scaled = [RequestSpec(r.request_id, r.tenant_id, r.model, r.arrival_s / load, r.prompt_tokens,
                                      r.output_tokens) for r in trace]
                workload = _deal(scaled, mix, config.horizon_s)
            for policy in policies:
                task = bar.add_task(f"{policy} x{load:g} ({workload.num_requests} requests)", total=1.0)
                def advance(_label: str, frac: float, task: Any = task) -> None:
                    bar.update(task, completed=frac)

                res, spans = run_policy(config, workload, policy, load_scale=load, progress=advance)
                bar.update(task, completed=1.0)
                results.append(res)
                if load == loads[len(loads) // 2]:
                    timelines[str(policy)] = spans

    report = {
        "config": {"cluster": cluster.name, "tenants": mix.name, "trace": args.trace, "seed": args.seed,
                   "duration_s": config.horizon_s, "loads": loads, "interval_s": args.interval,
                   "policies": [str(p) for p in policies], "cost_model": cost.describe(), "bad_trace_lines": bad_lines},
        "results": [r.summary() for r in results],
        "sustained_load_at_9pct": {str(p): sustained_load([r for r in results if r.policy == str(p)])
                                   for p in policies} if len(loads) > 1 else None,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    tmp = Path(tempfile.mkdtemp(prefix=".replay-", dir=out.parent if out.parent.exists() else None))
    try:
        (tmp / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
        for name, spans in timelines.items():
            plot_timeline(tmp / f"timeline-{name.replace('/', '-')}.png", spans,
                          title=f"{name}: device timeline (slices by tenant; gaps are idle)")
        plot_latency_cdfs(tmp / "latency_cdf.png", results)
        if len(loads) > 1:
            plot_load_sweep(tmp / "load_sweep.png", results)
        out.mkdir(parents=True, exist_ok=True)
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = [[r.policy, r.load_scale, r.num_requests, round(r.token_throughput_tps), f"{r.sla_violation_rate:.1%}",
             r.e2e_s["p50"], r.e2e_s["p99"], f"{r.mean_utilisation:.0%}", r.memory_violations, r.num_guest_replicas]
            for r in results]
    print_table(["policy", "load", "requests", "tokens/s", "SLA viol.", "e2e p50 s", "e2e p99 s", "util",
                 "mem viol.", "guests"], rows, title=f"replay of {mix.name} on {cluster.name}")
    print(f"wrote {out / 'report.json'} and plots in {report['wall_s']:.0f}s")
    if args.record:
        _record(report)
    return 0


def _record(report: dict[str, Any]) -> None:
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository

    settings = Neo4jSettings.from_env()
    repo = GraphRepository(open_driver(settings), database=settings.database)
    repo.apply_schema()
    uid = f"replay-{uuid.uuid4().hex[:12]}"
    repo.create_experiment(uid, kind="replay", config=report["config"], results=report["results"])
    print(f"recorded experiment {uid} in Neo4j (MATCH (e:Experiment {{uid: '{uid}'}}) RETURN e)")
