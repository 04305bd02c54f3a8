"""benchmarks/owner_isolation.py: the isolated slice variant keeps a device owner's TPOT as it
was under container while the shared ``slice`` raises it (a real replay), and the record's
ratios, largest rises and intervals."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from service.core.framework import Candidates
from service.core.policies import PLACEMENT_POLICIES, RegisteredPolicy
from service.core.scheduler import ReplicaChange
from service.replay.runner import PolicyName, run_policy


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    """The benchmark module, with ``slice-isolated`` in the placement registry for this test
    only. Importing it registers the prototype for the benchmark's processes; the other tests
    run in this process too and see the registry as core defines it (one of them holds it
    exact), so the module is imported here rather than at collection and the entry removed
    after."""
    import benchmarks.owner_isolation as module

    registry: dict[str, RegisteredPolicy] = PLACEMENT_POLICIES  # type: ignore[assignment]
    registry[module.ISOLATED] = RegisteredPolicy(module.isolated_policy, takes_device_search=True)
    try:
        yield module
    finally:
        registry.pop(module.ISOLATED, None)


def test_isolated_guests_leave_the_owners_tpot_as_container_while_shared_slices_raise_it(bench: ModuleType) -> None:
    ISOLATED, Cell, replay_setup = bench.ISOLATED, bench.Cell, bench.replay_setup
    load = 0.8
    tpot = {}
    guests = {}
    for placement in ("container", "slice", ISOLATED):
        config, registered, make = replay_setup(Cell("a100-4tenants", 0, 40.0, placement, None))
        res, _ = run_policy(config, make(load), PolicyName.parse(f"fifo/{registered}"), load_scale=load)
        tpot[placement], guests[placement] = res.tpot_p99_home_s_by_tenant, res.num_guest_replicas
    assert guests[ISOLATED] > 0 and guests["slice"] > 0  # both placed guests beside the owners
    alone = tpot["container"]
    # chat (GPT-2 small, ~2 ms iterations) takes turns with a 7B guest under slice...
    assert tpot["slice"]["chat"] > 5 * alone["chat"]
    # ...and is untouched when guests run only in its idle windows
    for tenant, seconds in tpot[ISOLATED].items():
        assert seconds <= 1.05 * alone[tenant], (tenant, seconds, alone[tenant])


def test_only_sliced_plans_that_yield_to_the_owners_pass(bench: ModuleType) -> None:
    whole = ReplicaChange("m", "f", ("d0",))
    turns = ReplicaChange("m", "f", ("d0", "d1"), (("d0", 0, 5), ("d1", 6, 11)), turns=True)
    yields = ReplicaChange("m", "f", ("d0", "d1"), (("d0", 0, 5), ("d1", 6, 11)))

    class Inner:
        def candidates(self, ctx: Any) -> Candidates:
            return Candidates(iter([whole, turns, yields]), ("m",))

    found = bench.OwnerPriorityOnly(Inner()).candidates(None)
    assert list(found.changes) == [yields] and found.wanting == ("m",)


def _row(bench: ModuleType, iso: float, sl: float, rep: float, cont: float,
         rises: tuple[float, float, float]) -> dict:
    row = {"container": {"sustained_load_9pct": cont}}
    for (p, load), rise in zip({bench.ISOLATED: iso, "slice": sl, "replica": rep}.items(), rises, strict=True):
        row[p] = {"sustained_load_9pct": load, "owner_tpot_p99": {"rise_max": rise}}
    row["ratios"] = bench.ratios(row)
    return row


def test_ratios_rises_and_their_intervals(bench: ModuleType) -> None:
    summarise = bench.summarise
    per_mix = {"m1": {"seeds": {"0": _row(bench, 1.2, 1.3, 1.25, 1.0, (0.01, 15.0, 12.0)),
                                "1": _row(bench, 0.9, 1.0, 1.0, 0.75, (0.03, 14.0, 16.0))}},
               "m2": {"seeds": {"0": _row(bench, 2.0, 2.4, 2.2, 1.6, (-0.02, 12.0, 11.0))}}}
    r = per_mix["m1"]["seeds"]["0"]["ratios"]
    assert r["isolated_over_container"] == 1.2 and r["isolated_over_replica"] == 0.96
    assert r["isolated_over_slice"] == round(1.2 / 1.3, 3) and r["slice_isolated_owner_tpot_p99_rise"] == 0.01
    s = summarise(per_mix, seed=0)
    assert s["isolated_owner_tpot_p99_rise_max"] == 0.03
    assert s["slice_owner_tpot_p99_rise_max"] == 15.0 and s["replica_owner_tpot_p99_rise_max"] == 16.0
    assert s["isolated_over_container_median"] == 1.2  # over 1.2, 1.2, 1.25
    ci = s["isolated_over_container_median_ci"]
    assert ci["n"] == 3 and ci["lo"] <= ci["median"] <= ci["hi"]
    missing = _row(bench, 1.0, 1.0, 1.0, 0.0, (0.0, 0.0, 0.0))["ratios"]  # container found no load within 9%
    assert missing["isolated_over_container"] is None
