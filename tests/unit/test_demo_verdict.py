"""The demo's verdict on the saturated tenant, and its note when the load left no idle time."""

from __future__ import annotations

import os
from typing import Any

import pytest

from service.api.capacity import CORES_FULL
from service.demo import print_busy_verdict

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
