"""The demo's verdict on the saturated tenant, and its note when the load left no idle time."""

from __future__ import annotations

import os
from typing import Any

import pytest

from service.harness.capacity import CORES_FULL
from service.harness.demo import print_busy_verdict

CALIBRATION = {"offered": {"acme": {"role": "saturated"}, "globex": {"role": "steady"}}}


def _runs(container_met: int, replica_met: int, busy_cores: float) -> dict[str, Any]:
    def run(met: int, cores: float) -> dict[str, Any]:
        return {"tenants": [{"tenant_id": "acme", "requests": 100, "sla_violations": 100 - met},
                            {"tenant_id": "globex", "requests": 50, "sla_violations": 0}],
                "cpu_cores": {"machine": cores}}
    return {"container": run(container_met, busy_cores), "replica": run(replica_met, busy_cores)}


def test_the_verdict_says_which_placement_kept_the_busy_tenant_within_its_sla(capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    print_busy_verdict(CALIBRATION, _runs(59, 95, 0.5 * (os.cpu_count() or 1)))
    out = capsys.readouterr().out
    assert "the saturated tenant acme" in out and "globex" not in out
    assert "container 59% of its requests met the SLA (not within its SLA)" in out
    assert "replica 95% of its requests met the SLA (within its SLA)" in out
    assert "little idle time" not in out  # half the cores busy: room to lend


def test_a_load_that_filled_the_cores_is_named_as_the_reason_replica_had_little_to_gain(
        capsys: pytest.CaptureFixture[str]) -> None:
    cores = os.cpu_count() or 1
    print_busy_verdict(CALIBRATION, _runs(59, 74, (CORES_FULL + 0.05) * cores))
    out = capsys.readouterr().out
    assert "not within its SLA" in out
    assert f"of {cores} cores busy under container placement" in out and "little idle time" in out


def test_the_calibration_says_when_the_light_loads_were_scaled_to_leave_idle_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    from service.harness.demo import print_calibration

    level = {"concurrency": 4, "requests": 24, "requests_per_s": 3.0, "tokens_per_s": 100.0}
    calibration = {
        "capacity": {t: {"model": "tiny", "sla_class": "standard", "levels": [level], "requests_per_s": 3.0,
                         "sla_alone": True, "background_rps": {}} for t in ("acme", "globex")},
        "offered": {"acme": {"role": "saturated", "multiple_of_capacity": 1.2, "scaled_by": 1.0, "rate_rps": 3.6},
                    "globex": {"role": "steady", "multiple_of_capacity": 0.2, "scaled_by": 0.5, "rate_rps": 0.3}},
        "machine_fit": {"cores": 2, "budget_cores": 1.6, "projected_cores": 1.9, "light_scale": 0.5},
        "machine": {"cores": 2, "load_avg_1m": 0.1, "busy_share": 0.02, "busy": False},
    }
    print_calibration(calibration)
    out = capsys.readouterr().out
    assert "0.30 (0.1x)" in out and "3.60 (1.2x)" in out  # the rate's multiple, as scaled
    assert "keep 1.90 of 2 cores busy" in out and "scaled by 0.50" in out
    calibration["machine_fit"]["light_scale"] = 1.0
    print_calibration(calibration)
    assert "scaled by" not in capsys.readouterr().out
