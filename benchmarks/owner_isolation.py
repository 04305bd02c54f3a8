"""owner_isolation: can guests leave their device owners' TPOT within 5% (issue 37's owner
isolation), and what does that cost in sustained load against container and replica?

``replay_headline`` measures each device owner's TPOT p99 beside the guests of ``replica`` and
``slice`` against container on the same requests, and finds it 15-17x higher for the smallest
owner (``chat``, GPT-2 small: 1.9 ms iterations alone, 32 ms beside a 7B guest). Both
placements' guests share time with the owners: a whole guest replica alternates iterations with
them, and a guest slice under owner priority may still run *between* two owner iterations when
the owner's SLA slack covers it (``SimConfig.guest_slack_fraction``, 0.8 of its tightest TPOT
target). Either way the owner stays within its SLA, and its TPOT becomes the guest's.

This benchmark puts beside them the variant that keeps owners as they were:

``slice-isolated``
    the ``slice`` policy under owner priority only: no whole guest replicas and no sliced plan
    that takes turns with the owners (:func:`isolated_policy`, registered here for the replay
    under that name: a prototype of a policy option the scheduler does not have yet), and the
    simulator's gap rule off (``guest_slack_fraction`` 0): a guest slice starts only when the
    owners of its device have nothing to run, never between two of an owner's iterations, so
    an owner waits at most one slice, and only for the first iteration after it was idle.

For each mix and seed, each placement's sustained load at <= 9% SLA violations (bisection, as
``replay_headline``: :class:`service.replay.sweep.LoadSearch`, 2%), its tokens/s there, and for
the sharing placements each owner's TPOT p99 rise against container on the same requests
(:func:`benchmarks.replay_headline.owner_isolation`). Placements: ``container``, ``replica``,
``slice``, ``slice-isolated``; mixes ``a100-4tenants`` (8xA100-nvlink) and ``a100-8tenants``
(2x8xA100); seeds 0, 1, 2; 120 s windows (``--quick``: seeds 0 and 1).

Results: ``results.mixes[mix].seeds[seed][placement]`` = ``{sustained_load_9pct,
tokens_per_s_at_9pct, owner_tpot_p99}`` and ``.ratios``; ``results.summary``:
``isolated_owner_tpot_p99_rise_max``, ``slice_owner_tpot_p99_rise_max`` and
``replica_owner_tpot_p99_rise_max`` (the largest rise over every mix, seed and owner);
``isolated_over_container_median``, ``isolated_over_replica_median``,
``isolated_over_slice_median`` and ``slice_over_replica_median`` (medians over every mix and seed
of sustained-load ratios), each with a bootstrap interval (``_ci``, seeds resampled within each
mix); ``results.plot``: per mix and seed, each placement's load over container's against its
owners' largest TPOT rise.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from learned.choice import add_cost_model_argument
from service.core.framework import CandidateFilter, Candidates, StepContext
from service.core.granularity import GranularPlacementPolicy, granular_policy
from service.core.policies import PLACEMENT_POLICIES, RegisteredPolicy

MIXES = ("a100-4tenants", "a100-8tenants")
PLACEMENTS = ("container", "replica", "slice", "slice-isolated")
SHARING = ("replica", "slice", "slice-isolated")
ISOLATED = "slice-isolated"
ISOLATED_GAP = 0.0  # SimConfig.guest_slack_fraction under slice-isolated
TARGET = 0.09
RATIOS = {"isolated_over_container": (ISOLATED, "container"), "isolated_over_replica": (ISOLATED, "replica"),
          "isolated_over_slice": (ISOLATED, "slice"), "slice_over_container": ("slice", "container"),
          "slice_over_replica": ("slice", "replica"), "replica_over_container": ("replica", "container")}


@dataclass(frozen=True)
class OwnerPriorityOnly:
    """Filter: ``inner``'s sliced plans that yield to the owners (no whole guest replica, no plan
    that takes turns)."""

    inner: CandidateFilter

    def candidates(self, ctx: StepContext) -> Candidates:
        found = self.inner.candidates(ctx)
        return Candidates((c for c in found.changes if c.stages and not c.turns), found.wanting)


def isolated_policy(**params: Any) -> GranularPlacementPolicy:
    """``slice`` under owner priority only: ``granular_policy(**params)`` with no whole guest
    replicas judged and its candidates through :class:`OwnerPriorityOnly`."""
    policy = granular_policy(**{**params, "max_candidates": 0})
    stage = policy.steps.stages[0]
    policy.steps = replace(policy.steps, stages=(replace(stage, filter=OwnerPriorityOnly(stage.filter)),))
    return policy


# The replay builds placements by name: slice-isolated is registered in every process that
# imports this module (the pool's workers import it to run a cell).
cast(dict[str, RegisteredPolicy], PLACEMENT_POLICIES).setdefault(
    ISOLATED, RegisteredPolicy(isolated_policy, takes_device_search=True))


@dataclass(frozen=True)
class Cell:
    """One placement's sustained-load search for a mix and seed (picklable)."""

    mix: str
    seed: int
    duration_s: float
    placement: str
    cost_model: str | None
    tolerance: float = 0.02
    start_load: float = 0.5


def replay_setup(cell: Cell) -> tuple[Any, str, Callable[[float], Any]]:
    """``(config, placement, make)``: the replay config the cell's placement runs under (for
    ``slice-isolated``: the simulator's gap rule :data:`ISOLATED_GAP`), the registered placement
    it runs, and its workload at a load."""
    from benchmarks.replay_headline import Cell as HeadlineCell
    from benchmarks.replay_headline import _workload_maker
    from learned.artifact import load_cost_model
    from service.replay.runner import ReplayConfig

    (cluster, mix), make = _workload_maker(HeadlineCell("mix", cell.mix, cell.seed, cell.duration_s, "container",
                                                        cell.cost_model))
    config = ReplayConfig(cluster, mix, load_cost_model(cell.cost_model).model, seed=cell.seed,
                          duration_s=cell.duration_s)
    if cell.placement != ISOLATED:
        return config, cell.placement, make
    return replace(config, sim=replace(config.sim, guest_slack_fraction=ISOLATED_GAP)), ISOLATED, make


def run_cell(cell: Cell) -> dict[str, Any]:
    """The cell's sustained load at 9%, its tokens/s there, and (sharing placements) its owners'
    TPOT p99 against container at that load."""
    from benchmarks.replay_headline import owner_isolation
    from service.replay.runner import PolicyName, run_policy
    from service.replay.sweep import LoadSearch

    started = time.perf_counter()
    config, placement, make = replay_setup(cell)
    tag = f"{cell.mix} s{cell.seed}"
    results: dict[float, Any] = {}

    def probe(load: float) -> tuple[float, float]:
        t = time.perf_counter()
        res, _ = run_policy(config, make(load), PolicyName.parse(f"fifo/{placement}"), load_scale=load)
        results[load] = res
        print(f"  {tag:20s} {cell.placement:15s} x{load:<7.4g} {res.token_throughput_tps:8.0f} tok/s "
              f"SLA viol {res.sla_violation_rate:6.1%}  ({time.perf_counter() - t:.0f}s)", flush=True)
        return res.sla_violation_rate, res.token_throughput_tps

    search = LoadSearch(probe, start=cell.start_load, rel_tol=cell.tolerance)
    found = search.sustained(TARGET)
    out: dict[str, Any] = {"sustained_load_9pct": round(found.load, 4),
                           "tokens_per_s_at_9pct": round(found.tokens_per_s, 1), "bracketed_9pct": found.bracketed,
                           "runs": len(search.probes)}
    if cell.placement in SHARING and found.load > 0 and found.load in results:
        out["owner_tpot_p99"] = owner_isolation(config, make, results[found.load], f"{tag} {cell.placement}")
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def ratios(row: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """A mix and seed's sustained-load ratios (:data:`RATIOS`) and each sharing placement's
    largest owner TPOT rise."""
    out: dict[str, float | None] = {}
    for name, (a, b) in RATIOS.items():
        top, bottom = row.get(a, {}).get("sustained_load_9pct"), row.get(b, {}).get("sustained_load_9pct")
        out[name] = round(top / bottom, 3) if top is not None and bottom else None
    for p in SHARING:
        rise = row.get(p, {}).get("owner_tpot_p99", {}).get("rise_max")
        out[f"{p.replace('-', '_')}_owner_tpot_p99_rise"] = None if rise is None else float(rise)
    return out


def summarise(per_mix: dict[str, Any], seed: int) -> dict[str, Any]:
    """Largest rises and median ratios over every mix and seed, each ratio with its bootstrap."""
    from service.replay.sweep import bootstrap

    def every(key: str) -> list[list[float]]:
        return [[float(v) for s in m["seeds"].values() if (v := s["ratios"].get(key)) is not None]
                for m in per_mix.values()]

    summary: dict[str, Any] = {}
    for p, key in ((ISOLATED, "isolated"), ("slice", "slice"), ("replica", "replica")):
        rises = [v for g in every(f"{p.replace('-', '_')}_owner_tpot_p99_rise") for v in g]
        summary[f"{key}_owner_tpot_p99_rise_max"] = max(rises) if rises else None
    for name in ("isolated_over_container", "isolated_over_replica", "isolated_over_slice", "slice_over_replica",
                 "slice_over_container", "replica_over_container"):
        groups = [g for g in every(name) if g]
        flat = [v for g in groups for v in g]
        summary[f"{name}_median"] = round(statistics.median(flat), 3) if flat else None
        if groups:
            summary[f"{name}_median_ci"] = bootstrap(
                groups, lambda gs: statistics.median([v for g in gs for v in g]), seed=seed)
    return summary


def plot(per_mix: dict[str, Any], path: Path) -> None:
    """Per mix and seed: each sharing placement's sustained load over container's (x) against its
    owners' largest TPOT p99 rise (y, log), with the 5% line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"replica": "tab:orange", "slice": "tab:blue", ISOLATED: "tab:green"}
    markers = {m: k for m, k in zip(per_mix, "os^D", strict=False)}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for mix, m in per_mix.items():
        for s in m["seeds"].values():
            r = s["ratios"]
            for p in SHARING:
                key = "isolated_over_container" if p == ISOLATED else f"{p}_over_container"
                x, y = r.get(key), r.get(f"{p.replace('-', '_')}_owner_tpot_p99_rise")
                if x is not None and y is not None:
                    ax.scatter(x, max(y, 1e-3), color=colours[p], marker=markers[mix], s=40, alpha=0.8)
    for p, c in colours.items():
        ax.scatter([], [], color=c, label=p)
    for mix, k in markers.items():
        ax.scatter([], [], color="grey", marker=k, label=mix)
    ax.axhline(0.05, color="black", lw=0.8, ls="--")
    ax.text(ax.get_xlim()[0], 0.055, " 5% (issue 37's target)", fontsize=8, va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("sustained load at <= 9% SLA violations, over container's")
    ax.set_ylabel("owners' largest TPOT p99 rise vs container (floor 0.1%)")
    ax.set_title("What guests cost their device owners (each point a mix and seed)")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_cells(cells: list[Cell], jobs: int) -> list[dict[str, Any]]:
    """Every cell's output, in the order of ``cells``."""
    from benchmarks import owner_isolation as this  # by module name, so that workers import it
    from service.replay.sweep import open_runner

    started = time.perf_counter()
    outputs: list[dict[str, Any]] = [{}] * len(cells)
    with open_runner(None, jobs) as runner:
        print(f"{len(cells)} cells on {runner.name}", flush=True)
        for n, (i, result) in enumerate(runner.map(this.run_cell, cells), start=1):
            outputs[i] = result
            c = cells[i]
            print(f"[{n}/{len(cells)}] {c.mix} seed {c.seed} {c.placement}: x{result['sustained_load_9pct']:g} "
                  f"({result['runs']} runs, {time.perf_counter() - started:.0f}s)", flush=True)
    return outputs


def main() -> int:
    p = _record.parser("owner_isolation", __doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=120.0, help="simulated seconds per run (default 120)")
    p.add_argument("--mixes", default=",".join(MIXES), help="comma-separated tenant mixes")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2; quick 0,1)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (each runs whole cells)")
    add_cost_model_argument(p)
    args = p.parse_args()
    if args.jobs < 1 or not args.duration > 0:
        p.error("--jobs must be at least 1 and --duration positive")
    try:
        seeds = [int(x) for x in (args.seeds or ("0,1" if args.quick else "0,1,2")).split(",")]
    except ValueError:
        p.error(f"--seeds expects integers separated by commas, got {args.seeds!r}")
    from benchmarks.replay_headline import MIXES as KNOWN

    mixes = [m for m in args.mixes.split(",") if m]
    unknown = [m for m in mixes if m not in KNOWN]
    if unknown or not mixes:
        p.error(f"--mixes: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(KNOWN)})")

    from learned.artifact import load_cost_model

    cost = load_cost_model(args.cost_model)  # trained here if missing, before the workers load it
    started = time.perf_counter()
    cells = [Cell(m, s, args.duration, pl, args.cost_model) for m in mixes for s in seeds for pl in PLACEMENTS]
    outputs = run_cells(cells, args.jobs)
    per_mix: dict[str, Any] = {}
    for c, o in zip(cells, outputs, strict=True):
        per_mix.setdefault(c.mix, {"cluster": KNOWN[c.mix], "seeds": {}})["seeds"].setdefault(str(c.seed), {})[
            c.placement] = o
    for m in per_mix.values():
        for s in m["seeds"].values():
            s["ratios"] = ratios(s)
    summary = summarise(per_mix, args.seed)
    plots = args.out / "owner_isolation"
    plots.mkdir(parents=True, exist_ok=True)
    plot(per_mix, plots / "owner_isolation.png")
    rise = summary["isolated_owner_tpot_p99_rise_max"]
    print(f"slice-isolated: owners' largest TPOT p99 rise {rise:+.1%}; over container "
          f"{summary['isolated_over_container_median']}x, over replica {summary['isolated_over_replica_median']}x, "
          f"over slice {summary['isolated_over_slice_median']}x (medians)", flush=True)
    _record.write("owner_isolation", args, {
        "mixes": {m: KNOWN[m] for m in mixes}, "seeds": seeds, "placements": list(PLACEMENTS),
        "duration_s": args.duration, "target": TARGET, "tolerance": 0.02, "start_load": 0.5,
        "isolated": {"policy": "slice", "max_candidates": 0, "sharing": "owner priority only",
                     "guest_slack_fraction": ISOLATED_GAP},
        "cost_model": cost.describe(), "jobs": args.jobs,
    }, {
        "summary": summary,
        "mixes": per_mix,
        "targets": {"isolated_owner_tpot_p99_rise_max_le_0_05": rise is not None and rise <= 0.05},
        "plot": "owner_isolation/owner_isolation.png",
        "wall_s": round(time.perf_counter() - started, 1),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
