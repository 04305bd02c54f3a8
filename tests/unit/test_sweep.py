"""Load sweeps (service.replay.sweep): the bisection for the sustained load, bootstrap
intervals, and cells run in process, on a process pool or on Ray with the same report."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.replay_headline import combine_group, ratios, summarise
from service.domain.error import InvalidInputError
from service.replay.oracle import ORACLE_ELASTIC
from service.replay.sweep import InProcess, LoadSearch, bootstrap, open_runner
from tests.conftest import cli_in_process

HAS_RAY = importlib.util.find_spec("ray") is not None


def knee(at: float, noise: float = 0.0):  # type: ignore[no-untyped-def]
    """Violations that pass 9% at load ``at`` (a steep, monotone curve), tokens = 1000 * load."""
    def probe(load: float) -> tuple[float, float]:
        return max(0.0, min(1.0, 0.09 + 2.0 * (load - at))) + noise * ((load * 1e4) % 1 - 0.5), 1000 * load
    return probe


@pytest.mark.parametrize("at", [0.013, 0.37, 0.5, 1.0, 3.3, 40.0])
def test_bisection_finds_the_knee_to_within_the_tolerance(at: float) -> None:
    search = LoadSearch(knee(at), start=0.5, rel_tol=0.02)
    s = search.sustained(0.09)
    assert s.bracketed and s.failing is not None and s.rel_width is not None
    assert s.load <= at < s.failing and s.rel_width <= 0.02
    assert (at - s.load) / at <= 0.02 and s.tokens_per_s == pytest.approx(1000 * s.load)
    assert len(search.probes) <= 16  # a bracket of factor 2^k, then about six halvings
    before = len(search.probes)
    assert search.sustained(0.09) == s and len(search.probes) == before  # cached: no run twice
    looser = search.sustained(0.5)
    assert looser.load >= s.load and looser.rel_width is not None and looser.rel_width <= 0.02


def test_bisection_says_when_it_found_no_crossing() -> None:
    never = LoadSearch(lambda load: (0.0, load), max_load=8.0).sustained(0.09)
    assert (never.load, never.bracketed, never.failing) == (8.0, False, None)
    always = LoadSearch(lambda load: (1.0, load), min_load=0.01).sustained(0.09)
    assert (always.load, always.bracketed, always.rel_width) == (0.0, False, None)
    with pytest.raises(InvalidInputError):
        LoadSearch(knee(1.0), start=0.0)


def test_bisection_over_noisy_violations_reports_the_first_crossing() -> None:
    search = LoadSearch(knee(0.6, noise=0.05), rel_tol=0.02)
    s = search.sustained(0.09)
    assert s.failing is not None and s.failing == min(p.load for p in search.walk() if p.violation > 0.09)
    assert all(p.violation <= 0.09 for p in search.walk() if p.load == s.load)


def test_bootstrap_is_seeded_and_brackets_its_median() -> None:
    values = [1.2, 1.5, 0.9, 1.1, 1.7]
    a = bootstrap([values], lambda g: statistics.median(g[0]), seed=8)
    assert a == bootstrap([values], lambda g: statistics.median(g[0]), seed=8)
    assert min(values) <= a["lo"] <= a["median"] <= a["hi"] <= max(values) and a["n"] == 5
    assert a["lo"] < a["hi"]
    one = bootstrap([[1.3]], lambda g: statistics.median(g[0]), seed=8)
    assert (one["lo"], one["median"], one["hi"], one["n"]) == (1.3, 1.3, 1.3, 1)
    two = bootstrap([[1.0, 1.2], [0.8, 0.9, 1.0]], lambda g: min(statistics.median(x) for x in g), seed=8)
    assert 0.8 <= two["lo"] <= two["hi"] <= 1.0 and two["n"] == 5
    with pytest.raises(ValueError):
        bootstrap([[]], lambda g: 0.0, seed=8)


def figures(load9: float, tokens: float) -> dict[str, object]:
    return {"sustained_load_9pct": load9, "tokens_per_s_at_9pct": tokens, "bracketed_9pct": True}


def test_the_ceiling_is_the_best_of_the_pooled_oracle_and_every_placement() -> None:
    group = combine_group({"container": figures(0.3, 400.0), "slice": figures(0.5, 800.0),
                           ORACLE_ELASTIC: figures(0.45, 900.0)}, (0.09,))
    top = group[ORACLE_ELASTIC]
    assert (top["sustained_load_9pct"], top["tokens_per_s_at_9pct"]) == (0.5, 900.0)
    assert top["set_by"] == {"sustained_load_9pct": "slice", "tokens_per_s_at_9pct": "pooled"}
    assert top["pooled"]["sustained_load_9pct"] == 0.45


def test_every_summary_ratio_has_its_interval() -> None:
    def seed(slice_c: float, slice_r: float) -> dict[str, object]:
        return {"ratios": {"slice_over_container": slice_c, "slice_over_replica": slice_r,
                           "ceiling_share": 0.5, "pooled_over_container": 1.2}, "ceiling_holds": True}
    per_mix = {"a100-4tenants": {"seeds": {"8": seed(1.4, 0.9), "9": seed(1.2, 1.1), "11": seed(1.6, 1.0)},
                                 "median": {"slice_over_container": 1.4, "slice_over_replica": 1.0}},
               "a100-8tenants": {"seeds": {"8": seed(1.1, 0.8)},
                                 "median": {"slice_over_container": 1.1, "slice_over_replica": 0.8}}}
    summary = summarise(per_mix, {}, 0, boot_seed=8)
    for key in ("slice_over_container_4tenants", "slice_over_container_8tenants", "slice_over_replica_min",
                "slice_over_replica_median", "ceiling_share", "pooled_over_container"):
        ci = summary[f"{key}_ci"]
        assert set(ci) == {"median", "lo", "hi", "n"} and ci["lo"] <= ci["median"] <= ci["hi"], key
    assert summary["slice_over_container_4tenants_ci"]["n"] == 3 and summary["slice_over_replica_min"] == 0.8
    assert summary["slice_over_replica_min_ci"]["hi"] <= 0.8  # the 8-tenant mix's one seed bounds the min
    assert "slice_over_container_traces_ci" not in summary  # a mix not run has no interval


def test_ratios_at_99pct_attainment_and_the_owners_tpot_rise() -> None:
    def f(load9: float, load1: float, rise: float | None = None) -> dict[str, object]:
        out: dict[str, object] = {**figures(load9, 100.0 * load9), "sustained_load_1pct": load1}
        if rise is not None:
            out["owner_tpot_p99"] = {"rise_max": rise}
        return out
    r = ratios({"container": f(0.4, 0.2), "replica": f(0.5, 0.3, 0.02), "slice": f(0.6, 0.5, 0.07)})
    assert r["slice_over_container"] == 1.5 and r["slice_over_container_1pct"] == 2.5
    assert r["slice_over_replica_1pct"] == pytest.approx(1.667, abs=1e-3) and r["replica_over_container_1pct"] == 1.5
    assert (r["slice_owner_tpot_p99_rise"], r["replica_owner_tpot_p99_rise"]) == (0.07, 0.02)
    # a run without the 1% target (or a placement that found no load within it) has no such ratio
    none = ratios({"container": figures(0.4, 40.0), "slice": figures(0.6, 60.0)})
    assert none["slice_over_container_1pct"] is None and none["slice_owner_tpot_p99_rise"] is None
    assert ratios({"container": f(0.4, 0.0), "slice": f(0.6, 0.5)})["slice_over_container_1pct"] is None

    def seed(c1: float, rise: float) -> dict[str, object]:
        return {"ratios": {"slice_over_container": 1.2, "slice_over_replica": 1.0, "slice_over_container_1pct": c1,
                           "slice_owner_tpot_p99_rise": rise}, "ceiling_holds": True}
    per_mix = {"a100-4tenants": {"seeds": {"0": seed(2.2, 0.01), "1": seed(1.8, 0.03)},
                                 "median": {"slice_over_container": 1.2, "slice_over_replica": 1.0,
                                            "slice_over_container_1pct": 2.0}},
               "a100-8tenants": {"seeds": {"0": seed(3.0, -0.02)},
                                 "median": {"slice_over_container": 1.2, "slice_over_replica": 1.0,
                                            "slice_over_container_1pct": 3.0}}}
    summary = summarise(per_mix, {"azure-code": {"ratios": {"slice_owner_tpot_p99_rise": 0.04}, "ceiling_holds": None}},
                        0, boot_seed=8)
    assert summary["slice_over_container_99pct_min"] == 2.0  # the smaller of the mixes' medians
    assert summary["owner_tpot_p99_rise_max"] == 0.04  # the traces count too
    ci = summary["slice_over_container_99pct_min_ci"]
    assert ci["lo"] <= ci["median"] <= ci["hi"] <= 3.0 and ci["n"] == 3
    assert summary["owner_tpot_p99_rise_max_ci"]["hi"] <= 0.03  # over the mixes' seeds


def square(x: int) -> int:
    return x * x


def test_a_pool_returns_every_cell_by_its_index() -> None:
    cells = list(range(7))
    with open_runner(None, 1) as runner:
        assert isinstance(runner, InProcess)
        inline = dict(runner.map(square, cells))
    with open_runner(None, 2) as runner:
        pooled = dict(runner.map(square, cells))
    assert inline == pooled == {i: i * i for i in cells}
    with pytest.raises(InvalidInputError, match="--jobs"), open_runner(None, 0):
        pass


def test_ray_missing_is_a_message_not_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # an import of ray now fails as if it were not installed
    res = cli_in_process("replay", "--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "5",
                         "--policy", "fifo/container", "--ray", "auto", "--out", str(tmp_path / "never"))
    assert res.returncode == 2 and "slicesched[ray]" in res.stderr and "Traceback" not in res.stderr


def replay_report(out: Path, *extra: str) -> dict[str, Any]:
    res = cli_in_process("replay", "--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "8",
                         "--seed", "8", "--policy", "fifo/container", "--policy", "fifo/replica",
                         "--load-sweep", "0.5,1.5", *extra, "--out", str(out))
    assert res.returncode == 0, res.stderr
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    report.pop("wall_s")
    for r in report["results"]:
        r.pop("wall_s")
    return report


@pytest.mark.slow
@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (the optional extra: pip install 'slicesched[ray]')")
def test_ray_and_the_pool_give_the_same_report(tmp_path: Path) -> None:
    inline = replay_report(tmp_path / "inline")
    pool = replay_report(tmp_path / "pool", "--jobs", "2")
    ray = replay_report(tmp_path / "ray", "--jobs", "2", "--ray", "auto")
    assert len(inline["results"]) == 4
    assert inline == pool == ray


@pytest.mark.slow
def test_the_headline_cells_give_the_same_figures_in_process_and_on_a_pool() -> None:
    """replay_headline's cells on a small mix (a bisection, a saturated run): bracketed to the
    tolerance, and the same figures wherever they ran (results ordered by cell)."""
    from benchmarks.replay_headline import Cell, run_jobs

    jobs = [("cell", Cell("mix", "synthetic-3", 8, 10.0, "container", "roofline", targets=(0.09,), tolerance=0.05,
                          start_load=4.0)),
            ("cell", Cell("saturated", "synthetic-3", 8, 5.0, "replica", "roofline", saturated_load=2.0))]
    inline = run_jobs(jobs, None, 1)
    pooled = run_jobs(jobs, None, 2)
    assert [o["figures"] for o in inline] == [o["figures"] for o in pooled]
    f = inline[0]["figures"]
    assert f["runs"] == inline[0]["runs"] == len(f["walk"]) <= 20
    if f["bracketed_9pct"]:
        assert f["bracket_rel_width_9pct"] <= 0.05 and f["sustained_load_9pct"] < f["failing_load_9pct"]
    assert inline[1]["figures"]["horizon_tokens_per_s"] > 0


@pytest.mark.slow
def test_a_sharing_placements_cell_weighs_its_owners_tpot_against_container() -> None:
    """A slice cell (a real bisection on a small mix) runs container on the same requests at its
    sustained load and compares each owner's TPOT p99 on its home replicas."""
    from benchmarks.replay_headline import Cell, run_cell

    out = run_cell(Cell("mix", "synthetic-3", 8, 10.0, "slice", "roofline", targets=(0.09,), tolerance=0.1,
                        start_load=2.0))
    f = out["figures"]
    owners = f["owner_tpot_p99"]
    assert owners["load"] == f["sustained_load_9pct"] > 0
    assert owners["with_guests_s"] and set(owners["rise"]) <= set(owners["with_guests_s"]) & set(owners["container_s"])
    for tenant, rise in owners["rise"].items():
        assert rise == pytest.approx(owners["with_guests_s"][tenant] / owners["container_s"][tenant] - 1, abs=1e-3)
    assert owners["rise_max"] == max(owners["rise"].values())
