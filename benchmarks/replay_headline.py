"""replay_headline: does operator-level slice placement beat whole-replica sharing and container
allocation, and how close does it come to a free, clairvoyant ceiling? Also: do the queue
policies and the calibration deliver?

Side by side, same requests for every placement, per tenant mix and seed:

1. ``container`` (static whole devices sized by average load), ``replica`` (guest replicas in
   idle devices), ``slice`` (operator-level slices of backlogged tenants' iterations in other
   tenants' idle windows) and ``oracle-elastic`` (the ceiling, :mod:`service.replay.oracle`:
   figure by figure the best of a pooled oracle's own figures, whole devices moved instantly and
   for free as the true next interval's arrivals call for, and every placement's; at least every
   placement's by construction). For each, the highest offered load with SLA violations <= 9%,
   <= 5% and <= 1% (99% attainment) (``--targets``), found by bisection (:class:`service.replay.sweep.LoadSearch`:
   bracketed by doubling or halving from ``--start-load``, then bisected until the bracket's
   relative width is <= ``--tolerance``, 2%; the figure is the highest load measured to pass,
   its failing bound and the width recorded; ``--search grid``: the old walk up a fixed grid,
   interpolated), and the token throughput at that load. Load is applied by ``--load-scaling``
   (:mod:`service.replay.loadscale`; default ``thin``: the load-1 workload thinned, or overlaid
   with thinned copies from other windows, so a trace keeps its shape; ``compress``: the old
   rate multiplication, a trace's clock sped up). Mixes:
   ``a100-4tenants`` and ``a100-6tenants`` on 8xA100-nvlink, ``a100-8tenants`` (eight tenants,
   124M to 70B, bursty ServeGen curves) on 2x8xA100; seeds 0, 1, 2 (medians reported, all kept).
2. Saturated: every tenant backlogged (load ``--saturated-load``) for ``--saturated-s``:
   tokens/s of each placement.
3. The same sustained-load figure with one public trace dealt to all tenants of a100-4tenants
   (``--traces``: Azure code, Azure conv, Mooncake), so no result rests on one trace.
4. Queue policies on container at a load where requests queue, and output-length calibration
   (first mix, first seed; as before).
5. Pooling (``--sparse-mix``, default ``a100-sparse``: 24 tenants, most of them small models, with
   rare, bursty ServeGen traffic): per seed, the fewest A100-80GB GPUs (hosts of eight) on which
   ``container``, ``replica`` and ``slice`` each serve the mix at load 1 with SLA violations <= 1%
   (99% attainment), by doubling from 16 then bisecting over the cluster's size
   (:func:`fewest_passing`: assumes more GPUs never hurt; every size tried is kept). Container
   needs a device group per tenant; the sharing placements pack homes onto shared devices where
   the cluster is smaller than that (:mod:`service.core.pooling`). The same requests at every size.
   Run alone (``--mixes "" --traces "" --no-queues``) it is the record ``replay_headline-sparse``.

Each (mix or trace, seed, placement) is one cell, run on a local process pool (``--jobs``) or on
Ray (``--ray ADDRESS``, ``--ray auto``: a local Ray), results ordered by cell, not by finish.
The ceiling (``oracle-elastic``) of a mix and seed is, figure by figure, the best of the pooled
oracle's own bisection and every placement's figures (the bisections probe different loads,
so there is no common load to compare runs at): at least every placement's by construction.

Summary (``results.summary``): ``slice_over_container_4tenants``, ``slice_over_container_8tenants``
(medians over seeds of the sustained-load ratio at 9%), ``slice_over_replica_min`` (smallest
median over the mixes), ``memory_violations`` (total, every run), ``ceiling_share`` (median over
mixes and seeds of slice's gain over container as a share of the ceiling's gain),
``ceiling_holds`` (the ceiling's sustained load and tokens/s at 9% at least every placement's, in
every mix and seed: the load by construction, the tokens under the assumption the oracle module
states) and ``pooled_over_container`` (median: the pooled oracle's own sustained load over
container's, how far above the placements the pool alone reaches) and ``slice_over_replica_median``
(median over every mix's seeds); ``sparse_gpus_saved`` (median over seeds of 1 - slice's fewest
GPUs / container's on the sparse mix, part 5; ``sparse_replica_gpus_saved`` the same for
replica); at 99% SLO attainment (violations <= 1%, the 0.01 target),
``slice_over_container_99pct_min`` (the smallest over the mixes of the median ratio of sustained
loads); owner isolation, ``owner_tpot_p99_rise_max`` (the largest over every mix, seed and trace
of: at slice's sustained load at 9%, each device owner's TPOT p99 over the requests its home
replicas served, beside slice's guests, against the same requests under container, minus 1;
``replica_owner_tpot_p99_rise_max`` the same for replica's guests; a cell's per-tenant figures
under ``owner_tpot_p99``). Beside each ratio ``KEY``, ``KEY_ci``: a bootstrap over the
seeds (seeds resampled with replacement within each mix, the statistic recomputed; 2,000
resamples from a seeded Generator): ``{median, lo, hi, n}``, the median and the 5th and 95th
percentiles of the resampled statistic and the number of seeds it rests on. Requests are not
resampled: a figure is a bisection over whole simulations, so resampling requests would mean
running them again.
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from learned.choice import add_cost_model_argument
from service.replay.loadscale import DEFAULT_LOAD_SCALING, LOAD_SCALINGS
from service.replay.oracle import ORACLE_ELASTIC

MIXES = {"a100-4tenants": "8xA100-nvlink", "a100-6tenants": "8xA100-nvlink", "a100-8tenants": "2x8xA100"}
PLACEMENTS = ("container", "replica", "slice", "oracle-elastic")
TARGETS = (0.09, 0.05, 0.01)  # SLA violation rates a sustained load is found for (0.01: 99% attainment)
#: Placements whose guests share an owner's devices: their owners' TPOT is compared with container's.
SHARING = ("replica", "slice")
#: The sparse mix: the fewest A100s that serve it at 99% attainment, per placement (item 5 above).
SPARSE_MIX = "a100-sparse"
SPARSE_PLACEMENTS = ("container", "replica", "slice")
SPARSE_TARGET = 0.01  # SLA violation rate: 99% attainment
SPARSE_MAX_GPUS = 256  # the search gives up above this (a placement that never holds the mix)
#: The old walk's grid, kept to compare: ``--search grid`` walks it upwards until violations pass 9%.
GRID = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)


def pct(target: float) -> str:
    """A target's key suffix: 0.09 -> ``9pct``."""
    return f"{round(target * 100, 2):g}pct"


@dataclass(frozen=True)
class Cell:
    """One unit of work for a worker: a placement's sustained-load search for a (mix or trace,
    seed), or its saturated run. Picklable; everything it computes follows from its fields."""

    kind: str  # "mix" | "trace" | "saturated" | "sparse"
    name: str  # the mix, or the trace dealt to a100-4tenants
    seed: int
    duration_s: float
    placement: str
    cost_model: str | None
    load_scaling: str = DEFAULT_LOAD_SCALING
    search: str = "bisect"  # "bisect" | "grid"
    targets: tuple[float, ...] = TARGETS
    tolerance: float = 0.02
    start_load: float = 0.5
    saturated_load: float = 4.0
    keep_spans: bool = False  # return the device timeline of the highest load within 9% (for plots)

    @property
    def group(self) -> tuple[str, str, int]:
        return self.kind, self.name, self.seed


def _workload_maker(cell: Cell) -> tuple[Any, Callable[[float], Any]]:
    import numpy as np

    from service.cluster.spec import load_cluster_spec
    from service.domain.request import Workload
    from service.replay.binding import DealMode, deal, parse_binding, read_source
    from service.replay.context import fit_context
    from service.replay.loadscale import parse_load_scaling, scale_trace
    from service.replay.mix import load_mix, sample_workload

    scaling = parse_load_scaling(cell.load_scaling)
    if cell.kind == "trace":
        mix = load_mix("a100-4tenants")
        binding = parse_binding(cell.name)
        requests = read_source(binding.source).requests
        mode: DealMode = "session" if cell.name == "mooncake" else "round-robin"  # only Mooncake has sessions

        def make_trace(load: float) -> Workload:
            timed = scale_trace(requests, offset_s=0.0, rate_scale=1.0, horizon_s=cell.duration_s, load=load,
                                scaling=scaling, rng=np.random.default_rng(cell.seed),
                                arrange=lambda rs: deal(rs, mix.tenants, mode, source=binding.source))
            fitted, _ = fit_context(timed, "clamp")
            return Workload(f"a100-4tenants+{binding.source}", fitted, horizon_s=cell.duration_s)
        return (load_cluster_spec("8xA100-nvlink"), mix), make_trace
    mix = load_mix(cell.name)

    def make(load: float) -> Workload:
        return sample_workload(mix, np.random.default_rng(cell.seed), duration_s=cell.duration_s, load_scale=load,
                               scaling=scaling)[0]
    return (load_cluster_spec(MIXES.get(cell.name, "8xA100-nvlink")), mix), make


def run_cell(cell: Cell) -> dict[str, Any]:
    """A cell's figures (``figures``), every run's result (``results``, for the load-sweep plot),
    the kept timeline (``spans``), the memory violations of all its runs, its run count and wall
    time. For ``oracle-elastic`` the figures are the pooled oracle's own (the ceiling is made
    from every cell of its mix and seed, :func:`combine_group`)."""
    from learned.artifact import load_cost_model
    from service.replay.runner import PolicyName, ReplayConfig, run_policy
    from service.replay.sweep import LoadSearch

    started = time.perf_counter()
    (cluster, mix), make = _workload_maker(cell)
    config = ReplayConfig(cluster, mix, load_cost_model(cell.cost_model).model, seed=cell.seed,
                          duration_s=cell.duration_s)
    tag = f"{cell.kind} {cell.name} s{cell.seed}"
    results: dict[float, Any] = {}
    spans_at: dict[float, Any] = {}

    def run(load: float) -> tuple[float, float]:
        t = time.perf_counter()
        w = make(load)
        res, spans = run_policy(config, w, PolicyName.parse(f"fifo/{cell.placement}"), load_scale=load)
        results[load] = res
        # only the highest load within the loosest target keeps its timeline (a run's spans are large)
        if cell.keep_spans and res.sla_violation_rate <= max(cell.targets) and load > max(spans_at, default=0.0):
            spans_at.clear()
            spans_at[load] = spans
        print(f"  {tag:30s} {cell.placement:15s} x{load:<7.4g} {w.num_requests:6d} req "
              f"{res.token_throughput_tps:8.0f} tok/s SLA viol {res.sla_violation_rate:6.1%}  "
              f"moves {res.num_guest_replicas:3d}  ({time.perf_counter() - t:.0f}s)", flush=True)
        return res.sla_violation_rate, res.token_throughput_tps

    out: dict[str, Any] = {"cell": cell}
    if cell.kind == "saturated":
        run(cell.saturated_load)
        out["figures"] = {"horizon_tokens_per_s": round(results[cell.saturated_load].horizon_tokens_per_s, 1)}
    else:
        search = LoadSearch(run, start=cell.start_load, rel_tol=cell.tolerance)
        if cell.search == "grid":
            grid_walk(search, max(cell.targets))
        figures: dict[str, Any] = {}
        found = {}
        for target in cell.targets:
            s = found[target] = interpolated(search, target) if cell.search == "grid" else search.sustained(target)
            figures |= {f"sustained_load_{pct(target)}": round(s.load, 4),
                        f"tokens_per_s_at_{pct(target)}": round(s.tokens_per_s, 1),
                        f"bracketed_{pct(target)}": s.bracketed,
                        f"failing_load_{pct(target)}": None if s.failing is None else round(s.failing, 4),
                        f"bracket_rel_width_{pct(target)}": None if s.rel_width is None else round(s.rel_width, 4)}
        figures["walk"] = [{"load": round(p.load, 6), "sla_violation": round(p.violation, 4),
                            "tokens_per_s": round(p.tokens_per_s, 1)} for p in search.walk()]
        figures["runs"] = len(search.probes)
        if cell.placement == ORACLE_ELASTIC:
            figures["decisions"] = [results[p.load].decisions for p in search.walk()]
        if cell.placement in SHARING and found[0.09].load > 0 and found[0.09].load in results:
            figures["owner_tpot_p99"] = owner_isolation(config, make, results[found[0.09].load], tag)
        out["figures"] = figures
        out["spans"] = next(iter(spans_at.values()), None)  # the highest load probed within the loosest target
    out["results"] = [results[k] for k in sorted(results)]
    out["memory_violations"] = sum(r.memory_violations for r in results.values())
    out["runs"] = len(results)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def a100_cluster(gpus: int) -> Any:
    """``gpus`` A100-80GB on hosts of eight (NVLink inside a host, 200 Gb/s between hosts, as
    ``2x8xA100``), the last host holding the rest."""
    from service.domain.cluster import ClusterSpec

    hosts = [{"host_id": f"node{h}", "devices": {"kind": "A100-80GB", "count": min(8, gpus - 8 * h)},
              "intra_link": {"kind": "nvlink", "gbps": 2400, "latency_us": 2}} for h in range((gpus + 7) // 8)]
    return ClusterSpec.from_dict({"name": f"{gpus}xA100", "hosts": hosts,
                                  "network": {"kind": "network", "gbps": 200, "latency_us": 5}})


def fewest_passing(passes: Callable[[int], bool], start: int, most: int) -> tuple[int | None, list[int]]:
    """The smallest ``n`` in ``1..most`` with ``passes(n)``, assuming that more never hurts: from
    ``start``, doubling until one passes (or ``most`` fails), then bisecting between the largest
    failing and the smallest passing size. Returns it (None: even ``most`` fails) and the sizes
    tried, in order."""
    tried: list[int] = []
    verdict: dict[int, bool] = {}

    def probe(n: int) -> bool:
        if n not in verdict:
            tried.append(n)
            verdict[n] = passes(n)
        return verdict[n]

    n = max(1, min(start, most))
    while not probe(n):
        if n >= most:
            return None, tried
        n = min(most, 2 * n)
    fail = max((k for k, ok in verdict.items() if not ok and k < n), default=0)
    good = n
    while good - fail > 1:
        mid = (good + fail) // 2
        if probe(mid):
            good = mid
        else:
            fail = mid
    return good, tried


def fewest_gpus_cell(cell: Cell) -> dict[str, Any]:
    """The fewest A100s (:func:`a100_cluster`) on which ``cell.placement`` serves the mix at load 1
    with SLA violations <= :data:`SPARSE_TARGET`, by :func:`fewest_passing` from the mix's 16.
    Container allocation cannot run on fewer devices than the tenants' groups (a probe there
    fails, its reason kept); the sharing placements pack homes there (:mod:`service.core.pooling`),
    and a probe whose replicas do not fit the devices' memory fails the same way. The requests
    are the same at every size (the seed's sample of the mix at load 1)."""
    import numpy as np

    from learned.artifact import load_cost_model
    from service.domain.error import InvalidInputError
    from service.replay.mix import load_mix, sample_workload
    from service.replay.runner import PolicyName, ReplayConfig, run_policy

    started = time.perf_counter()
    mix = load_mix(cell.name)
    cost = load_cost_model(cell.cost_model).model
    workload = sample_workload(mix, np.random.default_rng(cell.seed), duration_s=cell.duration_s)[0]
    walk: list[dict[str, Any]] = []
    results = []
    tag = f"sparse {cell.name} s{cell.seed}"

    def passes(gpus: int) -> bool:
        t = time.perf_counter()
        config = ReplayConfig(a100_cluster(gpus), mix, cost, seed=cell.seed, duration_s=cell.duration_s)
        try:
            res, _ = run_policy(config, workload, PolicyName.parse(f"fifo/{cell.placement}"))
        except InvalidInputError as exc:  # the homes do not fit this many devices
            walk.append({"gpus": gpus, "passes": False, "infeasible": str(exc)})
            print(f"  {tag:30s} {cell.placement:15s} {gpus:4d} GPUs: cannot hold the mix ({exc})", flush=True)
            return False
        results.append(res)
        ok = res.sla_violation_rate <= SPARSE_TARGET
        walk.append({"gpus": gpus, "passes": ok, "sla_violation": round(res.sla_violation_rate, 4),
                     "tokens_per_s": round(res.token_throughput_tps, 1), "guests": res.num_guest_replicas})
        print(f"  {tag:30s} {cell.placement:15s} {gpus:4d} GPUs: SLA viol {res.sla_violation_rate:6.2%} "
              f"{res.token_throughput_tps:8.0f} tok/s  moves {res.num_guest_replicas:3d}  "
              f"({time.perf_counter() - t:.0f}s)", flush=True)
        return ok

    fewest, _ = fewest_passing(passes, start=16, most=SPARSE_MAX_GPUS)
    return {"cell": cell, "figures": {"fewest_gpus": fewest, "walk": walk, "runs": len(walk)},
            "results": results, "memory_violations": sum(r.memory_violations for r in results),
            "runs": len(walk), "wall_s": round(time.perf_counter() - started, 1)}


def sparse_summary(by_seed: dict[int, dict[str, Any]], boot_seed: int) -> dict[str, Any]:
    """Per seed each placement's fewest GPUs and the share slice and replica save against
    container (``1 - placement / container``); medians and a bootstrap interval over seeds."""
    from service.replay.sweep import bootstrap

    seeds: dict[str, Any] = {}
    saved: dict[str, list[float]] = {"slice": [], "replica": []}
    for seed, figures in sorted(by_seed.items()):
        gpus = {p: f["fewest_gpus"] for p, f in figures.items()}
        row: dict[str, Any] = {"fewest_gpus": gpus, "walks": {p: f["walk"] for p, f in figures.items()}}
        for p in saved:
            if gpus.get(p) is not None and gpus.get("container"):
                row[f"{p}_gpus_saved"] = round(1 - gpus[p] / gpus["container"], 4)
                saved[p].append(row[f"{p}_gpus_saved"])
        seeds[str(seed)] = row
    out: dict[str, Any] = {"mix": SPARSE_MIX, "target_violations": SPARSE_TARGET, "seeds": seeds,
                           "median_fewest_gpus": {p: _median([float(r["fewest_gpus"][p]) for r in seeds.values()
                                                              if r["fewest_gpus"].get(p) is not None])
                                                  for p in SPARSE_PLACEMENTS}}
    for p, values in saved.items():
        out[f"{p}_gpus_saved"] = _median(values)
        if values:
            out[f"{p}_gpus_saved_ci"] = bootstrap([values], lambda g: statistics.median(g[0]), seed=boot_seed)
    return out


def plot_fewest_gpus(path: Path, sparse: dict[str, Any]) -> None:
    """Bars: each placement's fewest GPUs at 99% attainment, per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(sparse["seeds"], key=int)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(SPARSE_PLACEMENTS)
    for i, p in enumerate(SPARSE_PLACEMENTS):
        values = [sparse["seeds"][s]["fewest_gpus"].get(p) or 0 for s in seeds]
        bars = ax.bar([k + i * width for k in range(len(seeds))], values, width, label=p)
        ax.bar_label(bars, fontsize=8)
    ax.set_xticks([k + width * (len(SPARSE_PLACEMENTS) - 1) / 2 for k in range(len(seeds))],
                  [f"seed {s}" for s in seeds])
    ax.set_ylabel("fewest A100s at 99% SLO attainment")
    ax.set_title(f"{sparse['mix']}: GPUs each placement needs (fewer is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def owner_isolation(config: Any, make: Callable[[float], Any], shared: Any, tag: str) -> dict[str, Any]:
    """Each device owner's TPOT p99 with guests beside it against without: ``shared`` (a run of a
    placement that adds guests, at its sustained load at 9%) against ``container`` on the same
    requests (the same load and seed: no guests anywhere), per tenant over the requests its home
    replicas served (``PolicyResult.tpot_p99_home_s_by_tenant``). ``rise``: shared / container - 1."""
    from service.replay.runner import PolicyName, run_policy

    t = time.perf_counter()
    alone, _ = run_policy(config, make(shared.load_scale), PolicyName.parse("fifo/container"),
                          load_scale=shared.load_scale)
    with_guests, without = shared.tpot_p99_home_s_by_tenant, alone.tpot_p99_home_s_by_tenant
    rise = {tenant: round(with_guests[tenant] / without[tenant] - 1, 4) for tenant in sorted(with_guests)
            if tenant in without and without[tenant] > 0 and math.isfinite(with_guests[tenant])}
    print(f"  {tag:30s} owners' TPOT p99 beside guests vs container at x{shared.load_scale:<7.4g}: "
          f"largest rise {max(rise.values(), default=0.0):+.1%}  ({time.perf_counter() - t:.0f}s)", flush=True)
    return {"load": shared.load_scale, "with_guests_s": {k: round(v, 5) for k, v in with_guests.items()},
            "container_s": {k: round(v, 5) for k, v in without.items()}, "rise": rise,
            "rise_max": max(rise.values()) if rise else None}


def grid_walk(search: Any, stop_above: float) -> None:
    """The old walk: up :data:`GRID` until violations pass ``stop_above`` (kept to compare)."""
    for load in GRID:
        if search.run(load).violation > stop_above:
            break


def sustained(points: list[tuple[float, float, float]], target: float) -> tuple[float, float, bool]:
    """``(load, tokens/s, bracketed)`` at the highest load with violations <= target, linear
    between the bracketing grid points of ``points`` = sorted ``(load, violation, tokens/s)``
    (the old walk's figure, ``--search grid``)."""
    best = (0.0, 0.0, False)
    for (l0, v0, t0), (l1, v1, t1) in itertools.pairwise(points):
        if v0 <= target < v1:
            f = (target - v0) / (v1 - v0)
            return l0 + (l1 - l0) * f, t0 + (t1 - t0) * f, True
    if points and points[0][1] <= target:
        last = max(p for p in points if p[1] <= target)
        best = (last[0], last[2], False)  # never crossed: a lower bound
    return best


def interpolated(search: Any, target: float) -> Any:
    """:func:`sustained` over a walk's probes, as a :class:`~service.replay.sweep.Sustained`
    (``failing``: the grid point above the crossing)."""
    from service.replay.sweep import Sustained

    walk = search.walk()
    load, tokens, bracketed = sustained([(p.load, p.violation, p.tokens_per_s) for p in walk], target)
    failing = next((p.load for p in walk if p.violation > target), None)
    ok = max((p.load for p in walk if p.violation <= target and (failing is None or p.load < failing)), default=None)
    width = (failing - ok) / ok if bracketed and failing is not None and ok else None
    return Sustained(target, load, tokens, failing, bracketed, width)


def combine_group(figures: dict[str, dict[str, Any]], targets: tuple[float, ...]) -> dict[str, Any]:
    """A (mix or trace, seed)'s placements' figures with the ceiling made: ``oracle-elastic``'s
    figures, figure by figure, the best of the pooled oracle's (kept under ``pooled``) and every
    placement's, with which run set each (``set_by``)."""
    out = {p: f for p, f in figures.items() if p != ORACLE_ELASTIC}
    if ORACLE_ELASTIC in figures:
        pooled = figures[ORACLE_ELASTIC]
        runs = {"pooled": pooled, **out}
        top: dict[str, Any] = {"pooled": pooled, "set_by": {}}
        for target in targets:
            for key in (f"sustained_load_{pct(target)}", f"tokens_per_s_at_{pct(target)}"):
                by = max(runs, key=lambda p: runs[p][key])  # max keeps the first of equals: the pooled run
                top[key], top["set_by"][key] = runs[by][key], by
            top[f"bracketed_{pct(target)}"] = pooled[f"bracketed_{pct(target)}"]
        out[ORACLE_ELASTIC] = top
    return out


def ratios(r: dict[str, Any]) -> dict[str, float | None]:
    """Sustained-load ratios at 9% (and, where found, at 1%: 99% attainment), slice's share of the
    ceiling's gain over container, and the largest owner TPOT p99 rise of replica and slice."""
    def ratio(a: str, b: str, target: str = "9pct") -> float | None:
        key = f"sustained_load_{target}"
        if a in r and b in r and key in r[a] and key in r[b] and r[b][key] > 0:
            return round(float(r[a][key]) / float(r[b][key]), 3)
        return None

    def rise(placement: str) -> float | None:
        value = r.get(placement, {}).get("owner_tpot_p99", {}).get("rise_max")
        return None if value is None else float(value)
    share = pooled = None
    if all(k in r for k in ("slice", "container", ORACLE_ELASTIC)):
        gain = r[ORACLE_ELASTIC]["sustained_load_9pct"] - r["container"]["sustained_load_9pct"]
        if gain > 0:
            share = round((r["slice"]["sustained_load_9pct"] - r["container"]["sustained_load_9pct"]) / gain, 3)
    if ORACLE_ELASTIC in r and "container" in r and r["container"]["sustained_load_9pct"] > 0:
        pooled = round(float(r[ORACLE_ELASTIC]["pooled"]["sustained_load_9pct"])
                       / float(r["container"]["sustained_load_9pct"]), 3)
    return {"slice_over_container": ratio("slice", "container"), "slice_over_replica": ratio("slice", "replica"),
            "replica_over_container": ratio("replica", "container"),
            "oracle_over_container": ratio(ORACLE_ELASTIC, "container"), "ceiling_share": share,
            "pooled_over_container": pooled,
            "slice_over_container_1pct": ratio("slice", "container", "1pct"),
            "slice_over_replica_1pct": ratio("slice", "replica", "1pct"),
            "replica_over_container_1pct": ratio("replica", "container", "1pct"),
            "slice_owner_tpot_p99_rise": rise("slice"), "replica_owner_tpot_p99_rise": rise("replica")}


RATIO_KEYS = ("slice_over_container", "slice_over_replica", "replica_over_container", "oracle_over_container",
              "ceiling_share", "pooled_over_container", "slice_over_container_1pct", "slice_over_replica_1pct",
              "replica_over_container_1pct", "slice_owner_tpot_p99_rise", "replica_owner_tpot_p99_rise")


def ceiling_holds(r: dict[str, Any]) -> bool | None:
    """Whether the ceiling's sustained load and tokens/s at 9% are at least every placement's
    (``None`` without a ceiling)."""
    if ORACLE_ELASTIC not in r:
        return None
    top = r[ORACLE_ELASTIC]
    return all(top[k] >= x[k] for x in r.values() for k in ("sustained_load_9pct", "tokens_per_s_at_9pct"))


def queues_and_calibration(cell: Cell) -> dict[str, Any]:
    """Queue policies on container where requests queue, and output-length calibration; the
    runs' results for the latency plot."""
    from learned.artifact import load_cost_model
    from learned.estimator import calibration_study
    from service.data import resolve
    from service.replay.runner import PolicyName, ReplayConfig, run_policy
    from service.workload.readers import read_azure

    (cluster, mix), make = _workload_maker(cell)
    config = ReplayConfig(cluster, mix, load_cost_model(cell.cost_model).model, seed=cell.seed,
                          duration_s=cell.duration_s)
    summary: dict[str, Any] = {}
    all_queue = []
    for queue_load in (1.2, 1.5):
        w = make(queue_load)
        results = {pol: run_policy(config, w, PolicyName.parse(pol), load_scale=queue_load)[0]
                   for pol in ("fifo/container", "sjf/container", "aging-spf/container", "oracle-remaining/container")}
        print(f"  queues x{queue_load:g}: " + ", ".join(f"{k} p50 {v.e2e_s['p50']:.2f}s" for k, v in results.items()),
              flush=True)
        all_queue += list(results.values())
        fifo = results["fifo/container"]
        for pol, r in results.items():
            summary[f"{pol} x{queue_load:g}"] = {
                "e2e_p50_s": round(r.e2e_s["p50"], 3), "e2e_p99_s": round(r.e2e_s["p99"], 3),
                "median_change": round(r.e2e_s["p50"] / fifo.e2e_s["p50"] - 1, 4),
                "p99_change": round(r.e2e_s["p99"] / fifo.e2e_s["p99"] - 1, 4),
                "max_wait_long_s": round(r.max_wait_s_long, 2), "sla_violation": round(r.sla_violation_rate, 4)}
    code = read_azure(resolve("azure-llm-2023/AzureLLMInferenceTrace_code.csv"), tenant_id="t", model="llama2-7b")
    conv = read_azure(resolve("azure-llm-2023/AzureLLMInferenceTrace_conv.csv"), tenant_id="t", model="llama2-7b")
    return {"summary": summary, "calibration": calibration_study(code.requests, conv.requests), "results": all_queue}


def run_any(job: tuple[str, Cell]) -> dict[str, Any]:
    """What a worker runs: a sustained-load or saturated cell, or the queue/calibration part."""
    kind, cell = job
    if kind == "queues":
        return queues_and_calibration(cell)
    return fewest_gpus_cell(cell) if cell.kind == "sparse" else run_cell(cell)


# ---- the driver ----------------------------------------------------------------------------------
def build_cells(args: Any, duration: float, sat_s: float, seeds: list[int], mixes: list[str],
                placements: tuple[str, ...], traces: list[str]) -> list[tuple[str, Cell]]:
    """Every job of the run, in the order results are reported."""
    common = {"cost_model": args.cost_model, "load_scaling": args.load_scaling, "search": args.search,
              "targets": args.targets, "tolerance": args.tolerance, "start_load": args.start_load}
    cells = [Cell("mix", m, s, duration, p, keep_spans=s == 0, **common)
             for m in mixes for s in seeds for p in placements]
    cells += [Cell("trace", t, seeds[0], duration, p, **common) for t in traces for p in placements]
    if args.sparse_mix:
        cells += [Cell("sparse", args.sparse_mix, s, duration, p, **common) for s in seeds for p in SPARSE_PLACEMENTS]
    if mixes:
        cells += [Cell("saturated", m, seeds[0], sat_s, p, saturated_load=args.saturated_load, **common)
                  for m in mixes for p in placements]
    jobs = [("cell", c) for c in cells]
    if mixes and not args.no_queues:
        jobs.append(("queues", Cell("mix", mixes[0], seeds[0], duration, "container", **common)))
    return jobs


def run_jobs(jobs: list[tuple[str, Cell]], ray: str | None, n_workers: int) -> list[dict[str, Any]]:
    """Every job's output, in the order of ``jobs`` (not of completion)."""
    from benchmarks import replay_headline as this  # by module name, so that workers import it
    from service.replay.sweep import open_runner

    started = time.perf_counter()
    outputs: list[dict[str, Any] | None] = [None] * len(jobs)
    with open_runner(ray, n_workers) as runner:
        print(f"{len(jobs)} jobs on {runner.name}", flush=True)
        for n, (i, result) in enumerate(runner.map(this.run_any, jobs), start=1):
            outputs[i] = result
            kind, cell = jobs[i]
            print(f"[{n}/{len(jobs)}] {kind} {cell.kind} {cell.name} seed {cell.seed} {cell.placement} done "
                  f"({result.get('runs', '-')} runs, {time.perf_counter() - started:.0f}s)", flush=True)
    return [o for o in outputs if o is not None]


def bootstrap_summary(per_mix_ratios: dict[str, list[dict[str, float | None]]], seed: int) -> dict[str, Any]:
    """Bootstrap intervals (over seeds, within each mix) of the summary's ratios."""
    from service.replay.sweep import bootstrap

    def values(mix: str, key: str) -> list[float]:
        return [float(v) for r in per_mix_ratios.get(mix, []) if (v := r.get(key)) is not None]

    out: dict[str, Any] = {}
    for key, mix in (("slice_over_container_4tenants", "a100-4tenants"),
                     ("slice_over_container_8tenants", "a100-8tenants"),
                     ("slice_over_container_traces", "a100-4tenants-traces")):
        if values(mix, "slice_over_container"):
            out[f"{key}_ci"] = bootstrap([values(mix, "slice_over_container")], lambda g: statistics.median(g[0]),
                                         seed=seed)
    mixes = [m for m in per_mix_ratios if values(m, "slice_over_replica")]
    if mixes:
        groups = [values(m, "slice_over_replica") for m in mixes]
        out["slice_over_replica_min_ci"] = bootstrap(groups, lambda g: min(statistics.median(x) for x in g), seed=seed)
        out["slice_over_replica_median_ci"] = bootstrap(groups, lambda g: statistics.median([v for x in g for v in x]),
                                                        seed=seed)
    for key in ("ceiling_share", "pooled_over_container"):
        groups = [values(m, key) for m in per_mix_ratios if values(m, key)]
        if groups:
            out[f"{key}_ci"] = bootstrap(groups, lambda g: statistics.median([v for x in g for v in x]), seed=seed)
    groups = [values(m, "slice_over_container_1pct") for m in per_mix_ratios if values(m, "slice_over_container_1pct")]
    if groups:
        out["slice_over_container_99pct_min_ci"] = bootstrap(groups, lambda g: min(statistics.median(x) for x in g),
                                                             seed=seed)
    groups = [values(m, "slice_owner_tpot_p99_rise") for m in per_mix_ratios if values(m, "slice_owner_tpot_p99_rise")]
    if groups:
        out["owner_tpot_p99_rise_max_ci"] = bootstrap(groups, lambda g: max(v for x in g for v in x), seed=seed)
    return out


def assemble(jobs: list[tuple[str, Cell]], outputs: list[dict[str, Any]], mixes: list[str], seeds: list[int],
             plots: Path, boot_seed: int) -> dict[str, Any]:
    """The record's results from every job's output (plots written into ``plots``)."""
    from service.replay.report import plot_latency_cdfs, plot_load_sweep, plot_timeline
    from service.replay.sweep import bootstrap

    groups: dict[tuple[str, str, int], dict[str, Any]] = {}
    queue_out: dict[str, Any] = {}
    for (kind, cell), out in zip(jobs, outputs, strict=True):
        if kind == "queues":
            queue_out = out
            plot_latency_cdfs(plots / "latency_cdf.png", out["results"])
            continue
        groups.setdefault(cell.group, {})[cell.placement] = out
    per_group: dict[tuple[str, str, int], dict[str, Any]] = {}
    for (kind, name, seed), by_placement in groups.items():
        if kind == "saturated":
            per_group[(kind, name, seed)] = {p: o["figures"]["horizon_tokens_per_s"] for p, o in by_placement.items()}
            continue
        if kind == "sparse":
            per_group[(kind, name, seed)] = {p: o["figures"] for p, o in by_placement.items()}
            continue
        targets = next(iter(by_placement.values()))["cell"].targets
        figures = combine_group({p: o["figures"] for p, o in by_placement.items()}, targets)
        per_group[(kind, name, seed)] = {"placements": figures, "ratios": ratios(figures),
                                         "ceiling_holds": ceiling_holds(figures),
                                         "runs": sum(o["runs"] for o in by_placement.values())}
        stem = f"{kind}-{name}-seed{seed}"
        plot_load_sweep(plots / f"load_sweep-{stem}.png", [r for o in by_placement.values() for r in o["results"]])
        for placement, o in by_placement.items():
            if o.get("spans"):
                mid = o["cell"].duration_s / 2
                plot_timeline(plots / f"timeline-{stem}-{placement}.png", o["spans"],
                              title=f"{name} {placement}: device timeline (highest load within the SLA)")
                plot_timeline(plots / f"timeline-{stem}-{placement}-10s.png", o["spans"], window_s=(mid, mid + 10),
                              title=f"{name} {placement}: 10 s (thin bars: operator-level guest slices)")
    per_mix: dict[str, Any] = {}
    for m in mixes:
        per_seed = {str(s): per_group[("mix", m, s)] for s in seeds if ("mix", m, s) in per_group}
        ratio_lists = {k: [float(v) for r in per_seed.values() if (v := r["ratios"][k]) is not None]
                       for k in RATIO_KEYS}
        medians = {k: _median(v) for k, v in ratio_lists.items()}
        intervals = {f"{k}_ci": bootstrap([v], lambda g: statistics.median(g[0]), seed=boot_seed)
                     for k, v in ratio_lists.items() if v}
        per_mix[m] = {"cluster": MIXES.get(m, "8xA100-nvlink"), "seeds": per_seed, "median": medians,
                      "intervals": intervals}
    sparse_by_seed = {seed: r for (k, _, seed), r in per_group.items() if k == "sparse"}
    sparse = sparse_summary(sparse_by_seed, boot_seed) if sparse_by_seed else {}
    if sparse:
        plot_fewest_gpus(plots / "sparse_fewest_gpus.png", sparse)
    return {"per_mix": per_mix, "queues": queue_out, "sparse": sparse,
            "saturated": {n: r for (k, n, _), r in per_group.items() if k == "saturated"},
            "traces": {n: r for (k, n, _), r in per_group.items() if k == "trace"},
            "memory_violations": sum(o.get("memory_violations", 0) for o in outputs),
            "runs": sum(o.get("runs", 0) for o in outputs)}


def summarise(per_mix: dict[str, Any], per_trace: dict[str, Any], mem_violations: int, boot_seed: int,
              sparse: dict[str, Any] | None = None) -> dict[str, Any]:
    """``results.summary``: the headline ratios and, beside each, its bootstrap interval."""
    def med(mix: str, key: str) -> float | None:
        value = per_mix.get(mix, {}).get("median", {}).get(key)
        return None if value is None else float(value)

    def every(key: str) -> list[float]:
        return [float(s["ratios"][key]) for m in per_mix.values() for s in m["seeds"].values()
                if s["ratios"].get(key) is not None]

    over_replica = [m["median"]["slice_over_replica"] for m in per_mix.values()
                    if m["median"]["slice_over_replica"] is not None]
    holds = [s["ceiling_holds"] for m in per_mix.values() for s in m["seeds"].values()
             if s["ceiling_holds"] is not None]
    holds += [r["ceiling_holds"] for r in per_trace.values() if r["ceiling_holds"] is not None]
    shares, pooled, replica_all = every("ceiling_share"), every("pooled_over_container"), every("slice_over_replica")
    at_99 = [m["median"]["slice_over_container_1pct"] for m in per_mix.values()
             if m["median"].get("slice_over_container_1pct") is not None]
    rises = every("slice_owner_tpot_p99_rise") + [float(r["ratios"]["slice_owner_tpot_p99_rise"])
                                                  for r in per_trace.values()
                                                  if r["ratios"].get("slice_owner_tpot_p99_rise") is not None]
    replica_rises = every("replica_owner_tpot_p99_rise")
    summary: dict[str, Any] = {
        "slice_over_container_4tenants": med("a100-4tenants", "slice_over_container"),
        "slice_over_container_8tenants": med("a100-8tenants", "slice_over_container"),
        "slice_over_container_traces": med("a100-4tenants-traces", "slice_over_container"),
        "slice_over_replica_min": min(over_replica) if over_replica else None,
        "slice_over_replica_median": round(statistics.median(replica_all), 3) if replica_all else None,
        "memory_violations": mem_violations,
        "ceiling_share": round(statistics.median(shares), 3) if shares else None,
        "ceiling_holds": all(holds) if holds else None,
        "pooled_over_container": round(statistics.median(pooled), 3) if pooled else None,
        "slice_over_container_99pct_min": min(at_99) if at_99 else None,
        "owner_tpot_p99_rise_max": max(rises) if rises else None,
        "replica_owner_tpot_p99_rise_max": max(replica_rises) if replica_rises else None,
        "sparse_gpus_saved": (sparse or {}).get("slice_gpus_saved"),
        "sparse_replica_gpus_saved": (sparse or {}).get("replica_gpus_saved")}
    if (sparse or {}).get("slice_gpus_saved_ci"):
        summary["sparse_gpus_saved_ci"] = sparse["slice_gpus_saved_ci"]  # type: ignore[index]
    ratio_lists = {m: [s["ratios"] for s in v["seeds"].values()] for m, v in per_mix.items()}
    return summary | bootstrap_summary(ratio_lists, boot_seed)


def main() -> int:
    p = _record.parser("replay_headline", __doc__.splitlines()[0])
    p.add_argument("--duration", type=float, help="simulated seconds per run (default 900; quick 240)")
    p.add_argument("--mixes", default=",".join(MIXES), help="comma-separated tenant mixes")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--placements", default=",".join(PLACEMENTS))
    p.add_argument("--traces", default="azure-code,azure-conv,mooncake",
                   help="public traces dealt to a100-4tenants' tenants, first seed only (empty: none)")
    p.add_argument("--saturated-load", type=float, default=4.0)
    p.add_argument("--saturated-s", type=float, help="seconds of the saturated run (default 600; quick 150)")
    p.add_argument("--no-queues", action="store_true", help="skip the queue-policy and calibration part")
    p.add_argument("--sparse-mix", default=SPARSE_MIX,
                   help="the mix whose fewest GPUs at 99%% attainment each of container, replica and slice needs "
                        "(empty: skip that part)")
    p.add_argument("--load-scaling", choices=LOAD_SCALINGS, default=DEFAULT_LOAD_SCALING,
                   help="how load is applied: thin (thinned / superposed copies of the load-1 workload; a trace "
                        "keeps its shape) or compress (rates multiplied, a trace's clock sped up: the old way)")
    p.add_argument("--search", choices=("bisect", "grid"), default="bisect",
                   help="sustained load by bisection to --tolerance, or the old walk up a fixed grid (interpolated)")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="bisection: stop when (failing - passing) / passing <= this")
    p.add_argument("--start-load", type=float, default=0.5, help="bisection: the first load tried")
    p.add_argument("--targets", default=",".join(f"{t:g}" for t in TARGETS),
                   help="SLA violation rates to find the sustained load for (comma-separated; 0.09 is the headline's "
                        "and must be among them; 0.01 is 99%% attainment); each adds its keys, e.g. "
                        "sustained_load_1pct")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each runs whole cells)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run the cells as Ray tasks: a cluster's address, or 'auto' for a local Ray of --jobs CPUs "
                        "(needs the ray extra: pip install 'slicesched[ray]')")
    add_cost_model_argument(p)
    args = p.parse_args()
    if not (0 < args.tolerance < 1 and args.start_load > 0 and args.jobs >= 1):
        p.error("--tolerance must be in (0, 1), --start-load positive and --jobs at least 1")
    try:
        args.targets = tuple(sorted({float(x) for x in args.targets.split(",") if x}, reverse=True))
    except ValueError:
        p.error(f"--targets expects numbers separated by commas, got {args.targets!r}")
    if 0.09 not in args.targets or not all(0 <= t < 1 for t in args.targets):
        p.error("--targets are violation rates in [0, 1) and must include 0.09 (the headline's)")
    if args.ray is not None:
        from service.domain.error import InvalidInputError
        from service.replay.sweep import import_ray
        try:
            import_ray()
        except InvalidInputError as exc:
            p.error(str(exc))
    duration = args.duration or (240.0 if args.quick else 900.0)
    sat_s = args.saturated_s or (150.0 if args.quick else 600.0)
    seeds = [int(x) for x in (args.seeds or "0,1,2").split(",")]
    mixes = [m for m in args.mixes.split(",") if m]
    placements = tuple(x for x in args.placements.split(",") if x)
    traces = [t for t in args.traces.split(",") if t]

    from learned.artifact import load_cost_model

    cost = load_cost_model(args.cost_model)  # trained here if missing, before the workers load it
    # the trace variants alone (no mixes), or the sparse mix alone, are records of their own
    name = "replay_headline" if mixes else "replay_headline-traces" if traces else "replay_headline-sparse"
    plots = args.out / name
    plots.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = build_cells(args, duration, sat_s, seeds, mixes, placements, traces)
    outputs = run_jobs(jobs, args.ray, args.jobs)
    parts = assemble(jobs, outputs, mixes, seeds, plots, args.seed)
    per_mix, per_trace, queues = parts["per_mix"], parts["traces"], parts["queues"]
    summary = summarise(per_mix, per_trace, parts["memory_violations"], args.seed, parts["sparse"])
    calib = queues.get("calibration", {})
    s4, s8, sr = (summary["slice_over_container_4tenants"], summary["slice_over_container_8tenants"],
                  summary["slice_over_replica_min"])
    ceiling_ok = bool(summary["ceiling_holds"])
    _record.write(name, args, {
        "mixes": {m: MIXES.get(m, "8xA100-nvlink") for m in mixes}, "seeds": seeds, "placements": list(placements),
        "traces": {t: "dealt to a100-4tenants' tenants (" + ("session" if t == "mooncake" else "round-robin")
                   + f"), seed {seeds[0]}" for t in traces},
        "duration_s": duration, "load_scaling": args.load_scaling,
        "search": {"method": args.search, "tolerance": args.tolerance, "start_load": args.start_load,
                   "targets": list(args.targets)} if args.search == "bisect" else {"method": "grid", "grid": list(GRID)},
        "saturated_load": args.saturated_load, "saturated_s": sat_s, "cost_model": cost.describe(), "kv": "paged",
        "jobs": args.jobs, "ray": args.ray,
        "sparse": {"mix": args.sparse_mix, "placements": list(SPARSE_PLACEMENTS), "target_violations": SPARSE_TARGET,
                   "load": 1.0, "cluster": "N x A100-80GB, hosts of 8", "search_from_gpus": 16} if args.sparse_mix else None,
    }, {
        "summary": summary,
        "mixes": per_mix,
        "saturated_tokens_per_s": parts["saturated"],
        "traces": per_trace,
        "sparse": parts["sparse"],
        "queue_policies": queues.get("summary", {}),
        "calibration": calib,
        "targets": {"slice_over_container_4tenants_ge_1_5": bool(s4 and s4 >= 1.5),
                    "slice_over_container_8tenants_ge_2_29": bool(s8 and s8 >= 2.29),
                    "slice_over_replica_ge_1_15": bool(sr and sr >= 1.15),
                    "memory_violations_0": parts["memory_violations"] == 0,
                    # a share means something only where the ceiling beats every placement
                    "ceiling_share_ge_0_9": bool(summary["ceiling_share"] is not None and ceiling_ok
                                                 and summary["ceiling_share"] >= 0.9),
                    "ceiling_holds": ceiling_ok,
                    "slice_over_container_99pct_min_ge_2": bool(summary["slice_over_container_99pct_min"] is not None
                                                                and summary["slice_over_container_99pct_min"] >= 2.0),
                    "sparse_gpus_saved_ge_0_5": bool(summary["sparse_gpus_saved"] is not None
                                                     and summary["sparse_gpus_saved"] >= 0.5),
                    "owner_tpot_p99_rise_max_le_0_05": bool(summary["owner_tpot_p99_rise_max"] is not None
                                                            and summary["owner_tpot_p99_rise_max"] <= 0.05),
                    "calibration_ge_35pct": bool(calib) and min(calib.get("mae_reduction", 0),
                                                                calib.get("rmse_reduction", 0)) >= 0.35},
        "runs": parts["runs"],
        "plots": sorted(str(x.relative_to(args.out)) for x in plots.iterdir()),
        "wall_s": round(time.perf_counter() - started, 1),
    })
    return 0


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


if __name__ == "__main__":
    sys.exit(main())
