"""The replay's ceiling (``oracle-elastic``) is at or above every placement's headline figures.

On a seeded table of small random mixes (2-4 tenants on 2-4 A100s, 15 s windows, the roofline
cost model), each placement walks the load grid as ``benchmarks/replay_headline.py`` does (up to
the first load past 9% SLA violations), then the ceiling walks it: at each load the pooled
oracle's run raised to the best placement run at that load (:func:`ceiling_result`). Its
sustained load and tokens/s at 9% must be at least every placement's (the load by construction,
the tokens under the assumption :mod:`service.replay.oracle` states, checked here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.replay_headline import ceiling_holds, sustained
from learned.artifact import load_cost_model
from service.domain.cluster import ClusterSpec
from service.replay.mix import parse_mix, sample_workload
from service.replay.oracle import ORACLE_ELASTIC, ceiling_result
from service.replay.report import PolicyResult
from service.replay.runner import PolicyName, ReplayConfig, run_policy

GRID = (0.25, 0.5, 1.0, 2.0, 4.0)
PLACEMENTS = ("container", "replica", "slice")
MODELS = ("llama2-7b", "llama2-13b", "small-llama")


def random_case(seed: int) -> tuple[ClusterSpec, Any]:
    """A cluster of 2-4 A100s and a mix of 2-4 tenants (no more tenants than devices) with
    Poisson or bursty gamma arrivals and lognormal lengths, all drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    devices = int(rng.integers(2, 5))
    tenants = []
    for i in range(int(rng.integers(2, devices + 1))):
        arrivals: dict[str, Any] = {"kind": "poisson", "rate_rps": float(rng.uniform(1.0, 4.0))}
        if rng.random() < 0.5:
            arrivals = {"kind": "gamma", "rate_rps": arrivals["rate_rps"], "cv": float(rng.uniform(1.5, 4.0))}
        tenants.append({"tenant_id": f"t{i}", "model": str(rng.choice(MODELS)),
                        "sla_class": str(rng.choice(["interactive", "standard"])), "arrivals": arrivals,
                        "lengths": {"kind": "lognormal", "prompt_median": int(rng.integers(200, 1500)),
                                    "output_median": int(rng.integers(50, 300))}})
    mix = parse_mix({"name": f"case{seed}", "duration_s": 15, "tenants": tenants})
    cluster = ClusterSpec.from_dict({"name": f"{devices}xA100", "hosts": [
        {"host_id": "h0", "devices": {"kind": "A100-80GB", "count": devices},
         "intra_link": {"kind": "nvlink", "gbps": 2400, "latency_us": 2}}]})
    return cluster, mix


def walk(run: Any) -> list[PolicyResult]:
    """The headline's load walk: up the grid until violations pass 9%."""
    out = []
    for load in GRID:
        out.append(run(load))
        if out[-1].sla_violation_rate > 0.09:
            break
    return out


def figures(results: list[PolicyResult]) -> dict[str, float]:
    load, tokens, _ = sustained([(r.load_scale, r.sla_violation_rate, r.token_throughput_tps) for r in results], 0.09)
    return {"sustained_load_9pct": load, "tokens_per_s_at_9pct": tokens}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 14, 15])  # cases whose walks cross 9% within the grid
def test_the_ceiling_is_at_or_above_every_placement(seed: int) -> None:
    cluster, mix = random_case(seed)
    config = ReplayConfig(cluster, mix, load_cost_model("roofline").model, seed=seed, duration_s=15.0)
    workloads = {load: sample_workload(mix, np.random.default_rng(seed), duration_s=15.0, load_scale=load)[0]
                 for load in GRID}

    def runner(placement: str) -> Any:
        return lambda load: run_policy(config, workloads[load], PolicyName.parse(f"fifo/{placement}"),
                                       load_scale=load)[0]

    runs = {p: {r.load_scale: r for r in walk(runner(p))} for p in PLACEMENTS}
    pooled = runner(ORACLE_ELASTIC)
    ceiling = walk(lambda load: ceiling_result(pooled(load), [r[load] for r in runs.values() if load in r])[0])
    for p, by_load in runs.items():  # pointwise: what the construction rests on
        for r in ceiling:
            if r.load_scale in by_load:
                assert r.sla_violation_rate <= by_load[r.load_scale].sla_violation_rate, p
                assert r.token_throughput_tps >= by_load[r.load_scale].token_throughput_tps, p
    table = {p: figures(list(by_load.values())) for p, by_load in runs.items()}
    table[ORACLE_ELASTIC] = figures(ceiling)
    assert ceiling_holds(table), table
    assert all(r.memory_violations == 0 for by_load in runs.values() for r in by_load.values())


def test_a_ceiling_point_takes_the_best_figure_of_each_run_at_one_load() -> None:
    def result(policy: str, violations: float, tokens: float, load: float = 1.0) -> PolicyResult:
        return PolicyResult(policy, load, 20.0, 10, tokens, 0.0, violations, {}, {}, {}, {}, {}, {}, 0.0, {}, 0.0,
                            0.0, {}, 0)

    pooled = result("fifo/oracle-elastic", 0.2, 100.0)
    point, set_by = ceiling_result(pooled, [result("fifo/slice", 0.05, 90.0), result("fifo/replica", 0.3, 120.0)])
    assert (point.sla_violation_rate, point.token_throughput_tps) == (0.05, 120.0)
    assert set_by == {"sla_violation_rate": "fifo/slice", "token_throughput_tps": "fifo/replica"}
    _, by = ceiling_result(pooled, [result("fifo/container", 0.2, 100.0)])
    assert by == {"sla_violation_rate": "fifo/oracle-elastic", "token_throughput_tps": "fifo/oracle-elastic"}
    with pytest.raises(ValueError, match="one load"):
        ceiling_result(pooled, [result("fifo/slice", 0.0, 0.0, load=2.0)])
