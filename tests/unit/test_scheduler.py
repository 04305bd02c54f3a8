"""Scheduler.step checks the placement policy's decision and raises a project error, not assert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from service.core.scheduler import Decision, DeviceInfo, ReplicaChange, ReplicaInfo, Scheduler
from service.domain.error import InvariantError, SliceschedError


class _View:
    def devices(self) -> Sequence[DeviceInfo]:
        return [DeviceInfo("d0", "h", 1, 0.0, ("t/1",))]

    def replicas(self) -> Sequence[ReplicaInfo]:
        return [ReplicaInfo("t/1", "t", "t/m", "m", ("d0",), 0, 0, False, False, 0.0)]


def _check(decision: Decision) -> None:
    view: Any = _View()
    Scheduler._check(decision, view)


def test_a_decision_on_known_devices_and_replicas_passes() -> None:
    _check(Decision(add=[ReplicaChange("t/m", "m", ("d0",))], drain=["t/1"]))


def test_adding_on_an_unknown_device_raises_an_invariant_error() -> None:
    with pytest.raises(InvariantError, match="unknown devices"):
        _check(Decision(add=[ReplicaChange("t/m", "m", ("d0", "nope"))]))


def test_draining_an_unknown_replica_raises_an_invariant_error() -> None:
    with pytest.raises(InvariantError, match="unknown replicas") as info:
        _check(Decision(drain=["ghost"]))
    assert isinstance(info.value, SliceschedError)
