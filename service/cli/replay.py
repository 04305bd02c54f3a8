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
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import numpy as np

from learned.choice import add_cost_model_argument
from service.domain.error import InvalidInputError
from service.domain.experiment import DEFAULT_PROJECT, Experiment, Plot
from service.domain.request import Workload
from service.harness.console import print_table
from service.replay.binding import DEAL_MODES, TraceBinding
from service.replay.context import CONTEXT_MODES, ContextCounts, ContextMode
from service.replay.loadscale import DEFAULT_LOAD_SCALING, LOAD_SCALINGS, LoadScaling
from service.sim.config import KV_MODES, SimConfig


def add_parser(sub: Any) -> None:
    p = sub.add_parser("replay", help="replay a workload against queue/placement policies on a simulated cluster")
    p.add_argument("--trace", action="append", default=[], metavar="FILE[:TENANT[@OFFSET_S][*RATE_SCALE]]",
                   help="replay a trace file (Azure CSV, Mooncake JSONL, or a named trace: azure-code, azure-conv, "
                        "mooncake from $SLICESCHED_DATA). FILE:TENANT gives that tenant of the mix exactly the "
                        "file's requests (its model and SLA class kept), the file's first request at OFFSET_S "
                        "(default 0) and its rate times RATE_SCALE (default 1), e.g. code.csv:acme@30*2; "
                        "repeatable, one per tenant; unbound tenants keep the mix's own workload. A FILE without "
                        ":TENANT is dealt to all tenants and needs --deal. Default: the mix's own workload")
    p.add_argument("--deal", choices=DEAL_MODES,
                   help="deal one --trace FILE to all tenants: 'session' keeps each session (Mooncake: shared "
                        "prefix) in one tenant; 'round-robin' deals requests in turn")
    p.add_argument("--context", choices=CONTEXT_MODES, default="clamp",
                   help="requests longer than their model's context: 'clamp' cuts the prompt from the front and "
                        "caps the output (as engines with max_model_len do); 'reject' drops them (both counted)")
    p.add_argument("--cluster", default="8xA100-nvlink", help="built-in cluster spec or a YAML/JSON file")
    p.add_argument("--tenants", default="a100-4tenants", help="built-in tenant mix or a YAML/JSON file")
    p.add_argument("--policy", action="append", default=[], metavar="QUEUE/PLACEMENT",
                   help="e.g. fifo/container, sjf/slice (repeatable; default fifo/container, fifo/replica and fifo/slice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, help="seconds of trace to replay (default: the mix's)")
    p.add_argument("--load", type=float, default=1.0, help="offered load as a multiple of the mix's rates")
    p.add_argument("--load-sweep", help="comma-separated load multiples, e.g. 0.5,1,1.5,2")
    p.add_argument("--load-scaling", choices=LOAD_SCALINGS, default=DEFAULT_LOAD_SCALING,
                   help="how a load multiple is applied: 'thin' (default) keeps each request of the load-1 workload "
                        "with probability LOAD below 1 and lays thinned copies from other windows of its traces over "
                        "it above 1, so bursts stay where they are; 'compress' multiplies every rate (a trace's "
                        "clock sped up, pulling later bursts into the window)")
    p.add_argument("--jobs", type=int, default=1,
                   help="run the sweep's (load, policy) cells on this many worker processes (default 1: in this one)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the cells as Ray tasks: a running cluster's address, or 'auto' for a local Ray of "
                        "--jobs CPUs (needs the ray extra: pip install 'slicesched[ray]')")
    p.add_argument("--interval", type=float, default=5.0, help="scheduling step in simulated seconds")
    p.add_argument("--kv", choices=KV_MODES, default="paged",
                   help="KV management: paged (blocks grow with the tokens, the newest request preempted and "
                        "recomputed when memory runs out; default) or reserve (prompt plus whole output reserved "
                        "at admission)")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed trace rows (counted and reported)")
    p.add_argument("--out", required=True, help="output folder (report.json and plots)")
    p.add_argument("--record", action="store_true",
                   help="also record the run in Neo4j as an experiment: options, code version, data digests, cost "
                        "model, results and plots (see `slicesched experiments`)")
    p.add_argument("--project", default=DEFAULT_PROJECT, help="with --record: the project the experiment belongs to")
    p.add_argument("--for-tenant", metavar="TENANT", help="with --record: the tenant the experiment was run for")
    add_cost_model_argument(p)
    p.set_defaults(func=run)


def _bindings(specs: list[str], deal: str | None) -> tuple[list[TraceBinding], str]:
    """The ``--trace`` bindings and the dealing they ask for: "session" or "round-robin" (one file
    dealt to all tenants) or "per-tenant" (each tenant its own source: a bound file, the mix's
    trace or the mix's generator)."""
    from service.replay.binding import parse_binding

    bindings = [parse_binding(t) for t in specs if t != "synthetic"]
    unbound = [b for b in bindings if b.tenant_id is None]
    if unbound:
        if len(bindings) > 1:
            raise InvalidInputError("a --trace FILE dealt to all tenants cannot be combined with other --trace "
                                    "sources; bind each file to a tenant instead (FILE:TENANT)")
        if deal is None:
            raise InvalidInputError(f"--trace {unbound[0].source}: name the tenant it feeds (FILE:TENANT) or deal "
                                    "it to all tenants with --deal session or --deal round-robin")
        return bindings, deal
    if deal is not None:
        raise InvalidInputError("--deal applies to a single --trace FILE given without a tenant")
    tenants = [b.tenant_id for b in bindings]
    twice = sorted({t for t in tenants if tenants.count(t) > 1 and t is not None})
    if twice:
        raise InvalidInputError(f"--trace binds tenant(s) {', '.join(twice)} more than once")
    return bindings, "per-tenant"


def _sources(mix: Any, bindings: list[TraceBinding], dealing: str) -> dict[str, dict[str, Any]]:
    """Where each tenant's requests come from, for the report."""
    if dealing in DEAL_MODES:
        return {t.tenant_id: {**bindings[0].describe(), "dealt": dealing} for t in mix.tenants}
    return {t.tenant_id: dict(t.trace) if t.trace is not None
            else {"source": "mix", "arrivals": t.arrivals["kind"], "lengths": t.lengths["kind"]}
            for t in mix.tenants}


def _dealt_workload(binding: TraceBinding, mix: Any, *, mode: Any, context: Any, skip_bad: bool, load: float,
                    horizon_s: float, scaling: LoadScaling, seed: int) -> tuple[Workload, ContextCounts]:
    from service.replay.binding import deal, read_source
    from service.replay.context import fit_context
    from service.replay.loadscale import scale_trace

    requests = scale_trace(read_source(binding.source, skip_bad).requests, offset_s=binding.offset_s,
                           rate_scale=binding.rate_scale, horizon_s=horizon_s, load=load, scaling=scaling,
                           rng=np.random.default_rng(seed),
                           arrange=lambda rs: deal(rs, mix.tenants, mode, source=binding.source))
    fitted, counts = fit_context(requests, context)
    return Workload(f"{mix.name}+trace", fitted, horizon_s=horizon_s), counts


@dataclass(frozen=True)
class ReplaySetup:
    """What a replay's cells share, from the parsed options: hashable and picklable, so that a
    worker process (or a Ray task) rebuilds the cluster, mix and workloads from it alone."""

    cluster: str
    tenants: str
    trace: tuple[str, ...]
    deal: str | None
    context: ContextMode
    skip_bad: bool
    seed: int
    duration_s: float | None
    interval_s: float
    kv: str
    cost_model: str | None
    load_scaling: LoadScaling

    @classmethod
    def of(cls, args: argparse.Namespace) -> ReplaySetup:
        from service.replay.loadscale import parse_load_scaling

        return cls(args.cluster, args.tenants, tuple(args.trace), args.deal, cast(ContextMode, args.context),
                   bool(args.skip_bad),
                   int(args.seed), args.duration, float(args.interval), args.kv, args.cost_model,
                   parse_load_scaling(getattr(args, "load_scaling", DEFAULT_LOAD_SCALING)))


@dataclass(frozen=True)
class Prepared:
    """A setup made concrete: the validated mix (traces bound), its bindings, the cost model and
    the replay's configuration."""

    mix: Any
    bindings: list[TraceBinding]
    dealing: str
    cost: Any
    config: Any


@lru_cache(maxsize=4)
def prepare(setup: ReplaySetup) -> Prepared:
    """Validate and build ``setup`` (once per process): :class:`InvalidInputError` names what is wrong."""
    from learned.artifact import load_cost_model
    from service.cluster.spec import load_cluster_spec
    from service.replay.mix import load_mix
    from service.replay.runner import ReplayConfig, check_fits

    cluster = load_cluster_spec(setup.cluster)
    mix = load_mix(setup.tenants)
    check_fits(cluster, mix)
    bindings, dealing = _bindings(list(setup.trace), setup.deal)
    for b in bindings:
        if b.tenant_id is not None:
            mix = mix.bind_trace(b.tenant_id, b.describe())
    if setup.duration_s is not None and not setup.duration_s > 0:
        raise InvalidInputError("--duration must be positive")
    cost = load_cost_model(setup.cost_model)
    config = ReplayConfig(cluster, mix, cost.model, seed=setup.seed, duration_s=setup.duration_s,
                          interval_s=setup.interval_s, sim=SimConfig(kv=setup.kv))
    return Prepared(mix, bindings, dealing, cost, config)


@lru_cache(maxsize=2)
def cell_workload(setup: ReplaySetup, load: float) -> tuple[Workload, ContextCounts]:
    """The workload at ``load`` (the same for every policy; kept for the next cell at that load)."""
    from service.replay.mix import sample_workload

    p = prepare(setup)
    if p.dealing in DEAL_MODES:
        return _dealt_workload(p.bindings[0], p.mix, mode=p.dealing, context=setup.context, skip_bad=setup.skip_bad,
                               load=load, horizon_s=p.config.horizon_s, scaling=setup.load_scaling, seed=setup.seed)
    return sample_workload(p.mix, np.random.default_rng(setup.seed), duration_s=p.config.horizon_s, load_scale=load,
                           context=setup.context, skip_bad=setup.skip_bad, scaling=setup.load_scaling)


@dataclass(frozen=True)
class ReplayCell:
    """One policy at one load: a task of the sweep."""

    setup: ReplaySetup
    load: float
    policy: str
    keep_spans: bool = False  # the device timeline comes back (the plotted load)


def run_cell(cell: ReplayCell, progress: Any = None) -> dict[str, Any]:
    """A cell's result (``result``), its timeline (``spans``, where kept) and the workload's
    context counts (``counts``)."""
    from service.replay.runner import PolicyName, run_policy

    workload, counts = cell_workload(cell.setup, cell.load)
    res, spans = run_policy(prepare(cell.setup).config, workload, PolicyName.parse(cell.policy),
                            load_scale=cell.load, progress=progress)
    return {"result": res, "spans": spans if cell.keep_spans else None, "counts": counts.summary(),
            "num_requests": workload.num_requests}


def _sla_targets(mix: Any) -> dict[str, dict[str, float | None]]:
    """The SLA classes the mix's tenants use (a missing target as None)."""
    used = {t.sla_class for t in mix.tenants}
    return {name: {k: (None if v == float("inf") else v) for k, v in
                   (("ttft_s", c.ttft_s), ("ttft_per_prompt_token_s", c.ttft_per_prompt_token_s),
                    ("tbt_s", c.tbt_s), ("e2e_s", c.e2e_s))}
            for name, c in mix.sla_classes.items() if name in used}


@dataclass(frozen=True)
class ReplayRun:
    """What one replay produced: the report (as written to ``DIR/report.json``), the plots
    written into ``DIR`` (absolute paths), the data it read (:func:`data_digests`), the
    options a rerun passes again (:func:`rerun_options`) and the cost model's description."""

    report: dict[str, Any]
    out: Path
    plots: tuple[Path, ...]
    data_digests: dict[str, str]
    options: dict[str, Any]
    cost_model: dict[str, Any]


def run(args: argparse.Namespace) -> int:
    outcome = execute(args)
    report = outcome.report
    rows = [[r["policy"], r["load_scale"], r["num_requests"], round(r["token_throughput_tps"]),
             f"{r['sla_violation_rate']:.1%}", r["e2e_s"]["p50"], r["e2e_s"]["p99"], f"{r['mean_utilisation']:.0%}",
             r["memory_violations"], r["num_guest_replicas"]] for r in report["results"]]
    print_table(["policy", "load", "requests", "tokens/s", "SLA viol.", "e2e p50 s", "e2e p99 s", "util",
                 "mem viol.", "guests"], rows,
                title=f"replay of {report['config']['tenants']} on {report['config']['cluster']}")
    fitted = ", ".join(f"x{c['load']:g}: {c['clamped']} clamped, {c['rejected']} rejected of {c['requests']}"
                       for c in report["workload"]["context"]["by_load"])
    print(f"dealing: {report['workload']['dealing']}; context ({args.context}) {fitted}")
    print(f"wrote {outcome.out / 'report.json'} and plots in {report['wall_s']:.0f}s")
    if args.record:
        _record(experiment_of(outcome, uid=f"replay-{uuid.uuid4().hex[:12]}", project=args.project,
                              tenant_id=args.for_tenant))
    return 0


def execute(args: argparse.Namespace) -> ReplayRun:
    """Run the replay ``args`` describe and write ``args.out``; print nothing but progress.
    Its (load, policy) cells run in this process (``--jobs 1``), on a process pool or on Ray
    (:func:`service.replay.sweep.open_runner`); the report is the same wherever they ran."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from service.replay.binding import read_source
    from service.replay.report import plot_latency_cdfs, plot_load_sweep, plot_timeline
    from service.replay.runner import PolicyName, sustained_load
    from service.replay.sweep import InProcess, import_ray, open_runner

    if getattr(args, "ray", None) is not None:
        import_ray()  # before anything loads: a missing extra is a message, not a wait
    policies = [PolicyName.parse(p) for p in (args.policy or ["fifo/container", "fifo/replica", "fifo/slice"])]
    prepare.cache_clear()  # a rerun in a long-lived process reads its files afresh
    cell_workload.cache_clear()
    setup = ReplaySetup.of(args)
    prepared = prepare(setup)
    mix, bindings, dealing, cost, config = (prepared.mix, prepared.bindings, prepared.dealing, prepared.cost,
                                            prepared.config)
    cluster = config.cluster
    try:
        loads = [float(x) for x in args.load_sweep.split(",")] if args.load_sweep else [args.load]
    except ValueError:
        raise InvalidInputError(f"--load-sweep expects numbers separated by commas, got {args.load_sweep!r}") from None
    if any(not x > 0 for x in loads):
        raise InvalidInputError("loads must be positive")
    # read (and check) every trace file before anything runs; they stay cached for the loads
    files = {b.source for b in bindings} | {t.trace["source"] for t in mix.tenants if t.trace is not None}
    bad_lines = sum(read_source(f, args.skip_bad).num_bad for f in sorted(files))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {out} exists and is not a folder")
    digests = data_digests(args.cluster, args.tenants, mix, files)

    started = time.perf_counter()
    mid = loads[len(loads) // 2]
    cells = [ReplayCell(setup, load, str(policy), keep_spans=load == mid) for load in loads for policy in policies]
    outputs: list[dict[str, Any]] = [{} for _ in cells]
    with open_runner(getattr(args, "ray", None), getattr(args, "jobs", 1)) as runner, \
            Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                     TimeElapsedColumn()) as bar:
        if isinstance(runner, InProcess):  # each run's own progress
            for i, cell in enumerate(cells):
                task = bar.add_task(f"{cell.policy} x{cell.load:g}", total=1.0)

                def advance(_label: str, frac: float, task: Any = task) -> None:
                    bar.update(task, completed=frac)
                outputs[i] = run_cell(cell, advance)
                bar.update(task, completed=1.0,
                           description=f"{cell.policy} x{cell.load:g} ({outputs[i]['num_requests']} requests)")
        else:
            task = bar.add_task(f"{len(cells)} runs on {runner.name}", total=len(cells))
            for i, output in runner.map(run_cell, cells):
                outputs[i] = output
                bar.advance(task)
    results = [o["result"] for o in outputs]
    context_by_load = [{"load": load, **next(o["counts"] for c, o in zip(cells, outputs, strict=True)
                                             if c.load == load)} for load in loads]
    timelines = {c.policy: o["spans"] for c, o in zip(cells, outputs, strict=True) if o["spans"] is not None}

    report = {
        "config": {"cluster": cluster.name, "tenants": mix.name, "trace": args.trace or "synthetic",
                   "seed": args.seed, "duration_s": config.horizon_s, "loads": loads, "interval_s": args.interval,
                   "load_scaling": setup.load_scaling,
                   "policies": [str(p) for p in policies], "cost_model": cost.describe(), "kv": args.kv,
                   "bad_trace_lines": bad_lines,
                   "sla_classes": _sla_targets(mix)},
        "workload": {"dealing": dealing, "sources": _sources(mix, bindings, dealing),
                     "context": {"mode": args.context, "by_load": context_by_load}},
        "results": [r.summary() for r in results],
        "sustained_load_at_9pct": {str(p): sustained_load([r for r in results if r.policy == str(p)])
                                   for p in policies} if len(loads) > 1 else None,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    tmp = Path(tempfile.mkdtemp(prefix=".replay-", dir=out.parent if out.parent.exists() else None))
    plots: list[Path] = []
    try:
        (tmp / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
        for name, spans in timelines.items():
            stem = f"timeline-{name.replace('/', '-')}"
            plot_timeline(tmp / f"{stem}.png", spans, title=f"{name}: device timeline (work by tenant; gaps are idle)")
            mid = config.horizon_s / 2
            plot_timeline(tmp / f"{stem}-10s.png", spans, window_s=(mid, mid + 10.0),
                          title=f"{name}: 10 s of the device timeline (thin bars: operator-level guest slices)")
        plot_latency_cdfs(tmp / "latency_cdf.png", results)
        if len(loads) > 1:
            plot_load_sweep(tmp / "load_sweep.png", results)
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
            if f.suffix == ".png":
                plots.append((out / f.name).resolve())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ReplayRun(report, out, tuple(plots), digests, rerun_options(args), cost.describe())


# ---- experiment records -------------------------------------------------------------------------
#: Options that say where and whether to write, not what runs: a rerun chooses its own.
_NOT_RERUN = frozenset({"func", "command", "out", "record", "project", "for_tenant", "jobs", "ray"})


def rerun_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options that decide what a replay computes, made independent of where it
    runs: file arguments as absolute paths, the cost model's kind resolved (so that
    ``$SLICESCHED_COST_MODEL`` at rerun time cannot change it)."""
    from learned.choice import kind_from
    from service.cluster.spec import builtin_names
    from service.replay.binding import parse_binding
    from service.replay.mix import builtin_mixes

    options = {k: v for k, v in sorted(vars(args).items()) if k not in _NOT_RERUN}
    options["trace"] = [t if t == "synthetic" else _binding_text(parse_binding(t)) for t in args.trace]
    if args.cluster not in builtin_names():
        options["cluster"] = str(Path(args.cluster).resolve())
    if args.tenants not in builtin_mixes():
        options["tenants"] = str(Path(args.tenants).resolve())
    options["cost_model"] = kind_from(args.cost_model)
    return options


def _binding_text(b: TraceBinding) -> str:
    """A binding as ``--trace`` takes it again (the source already absolute or named)."""
    return b.source if b.tenant_id is None else f"{b.source}:{b.tenant_id}@{b.offset_s!r}*{b.rate_scale!r}"


def replay_arguments(options: dict[str, Any], out: Path) -> argparse.Namespace:
    """The ``argparse.Namespace`` of a replay with ``options`` (from :func:`rerun_options`)
    writing into ``out``: today's defaults for options the record does not hold, not recorded,
    except ``load_scaling``: a record without it was made with ``compress``, the only way then."""
    parser = argparse.ArgumentParser(prog="slicesched")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["replay", "--out", str(out)])
    unknown = sorted(set(options) - set(vars(args)))
    if unknown:
        raise InvalidInputError(f"the record's replay options {', '.join(unknown)} are not options of this "
                                "version's replay: it cannot be rerun as recorded")
    for key, value in options.items():
        setattr(args, key, value)
    if "load_scaling" not in options:  # recorded before the option: its loads compressed time
        args.load_scaling = "compress"
    args.record = False
    return args


def data_digests(cluster: str, tenants: str, mix: Any, trace_sources: set[str]) -> dict[str, str]:
    """SHA-256 of everything the replay reads: the cluster spec and the tenant mix (a built-in
    by its shipped content, keyed ``builtin:cluster/NAME`` / ``builtin:mix/NAME``; a file by its
    absolute path), each trace file (keyed by its name: a named trace or an absolute path) and
    each data file or folder a tenant's arrivals or lengths draw on (``servegen/SOURCE``)."""
    from service.cluster.spec import builtin_names
    from service.data import resolve
    from service.provenance import builtin_sha256, path_sha256
    from service.replay.binding import resolve_source
    from service.replay.mix import builtin_mixes

    out: dict[str, str] = {}
    for value, names, package, folder, label in ((cluster, builtin_names(), "service.cluster", "specs", "cluster"),
                                                 (tenants, builtin_mixes(), "service.replay", "mixes", "mix")):
        if value in names:
            out[f"builtin:{label}/{value}"] = builtin_sha256(package, folder, value)
        else:
            out[str(Path(value).resolve())] = path_sha256(Path(value))
    for source in sorted(trace_sources):
        out[source] = path_sha256(resolve_source(source))
    for t in mix.tenants:
        if t.trace is not None:
            continue
        for spec in (t.arrivals, t.lengths):
            if spec.get("kind") == "trace":
                out[spec["source"]] = path_sha256(resolve_source(spec["source"]))
            elif spec.get("kind") == "servegen" and spec is t.arrivals:
                out[f"servegen/{spec['source']}"] = path_sha256(resolve(f"servegen/{spec['source']}"))
    return out


def experiment_of(outcome: ReplayRun, *, uid: str, project: str = DEFAULT_PROJECT,
                  tenant_id: str | None = None) -> Experiment:
    """The experiment record of a replay: its config, options, provenance, results and plots."""
    from service.provenance import code_version, file_sha256

    report = outcome.report
    config = {**report["config"], "workload": report["workload"], "options": outcome.options,
              "sustained_load_at_9pct": report["sustained_load_at_9pct"]}
    plots = tuple(Plot(p.name, str(p), file_sha256(p), p.stat().st_size) for p in outcome.plots)
    return Experiment(uid=uid, kind="replay", config=config, code=code_version(), results=report["results"],
                      created_at=datetime.now(UTC).isoformat(timespec="milliseconds"), project=project,
                      tenant_id=tenant_id, seed=int(outcome.options["seed"]), data_digests=outcome.data_digests,
                      cost_model=outcome.cost_model, plots=plots, out_dir=str(outcome.out.resolve()))


def _record(experiment: Experiment) -> None:
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository

    settings = Neo4jSettings.from_env()
    repo = GraphRepository(open_driver(settings), database=settings.database)
    repo.apply_schema()
    uid = repo.experiments.create_experiment(experiment)
    print(f"recorded experiment {uid} in Neo4j (slicesched experiments show {uid})")
