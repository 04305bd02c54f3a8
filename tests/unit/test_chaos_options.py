"""benchmarks/chaos.py's own parts: the defaults that ``--placement slice`` brings (a busy tenant
whose home falls behind, so that sliced guests exist to be struck) and the bounded wait for an
executor holding one before an executor kill (the run itself is the benchmark)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

import benchmarks.chaos as chaos


def _args(**given: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"placement": "container", "rate": None, "busy_share": None, "busy_family": None,
                            "holder_wait_s": None}
    return argparse.Namespace(**{**base, **given})


def test_slice_placement_brings_a_busy_tenant_unless_told_otherwise() -> None:
    args = _args(placement="slice")
    chaos.apply_placement_defaults(args)
    assert (args.rate, args.busy_share, args.busy_family, args.holder_wait_s) == (3.0, 0.9, "small-llama", 10.0)

    given = _args(placement="slice", rate=1.5, busy_share=0.6, busy_family="tiny", holder_wait_s=0.0)
    chaos.apply_placement_defaults(given)
    assert (given.rate, given.busy_share, given.busy_family, given.holder_wait_s) == (1.5, 0.6, "tiny", 0.0)


@pytest.mark.parametrize("placement", ["container", "replica"])
def test_other_placements_keep_both_tenants_alike(placement: str) -> None:
    args = _args(placement=placement)
    chaos.apply_placement_defaults(args)
    assert (args.rate, args.busy_share, args.busy_family, args.holder_wait_s) == (2.0, None, "tiny", 0.0)


def test_the_holder_wait_returns_as_soon_as_an_executor_holds_a_sliced_guest(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([{"exec-a": 0, "exec-b": 0}, None, {"exec-a": 0, "exec-b": 2}])
    monkeypatch.setattr(chaos, "sliced_guests_held", lambda stack: next(answers))
    held, waited = chaos.wait_for_holder(object(), 5.0, period_s=0.01)
    assert held == {"exec-a": 0, "exec-b": 2}
    assert waited < 1.0


def test_the_holder_wait_gives_up_after_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def nobody(stack: object) -> dict[str, int]:
        calls.append(1)
        return {"exec-a": 0, "exec-b": 0}

    monkeypatch.setattr(chaos, "sliced_guests_held", nobody)
    held, waited = chaos.wait_for_holder(object(), 0.05, period_s=0.01)
    assert held == {"exec-a": 0, "exec-b": 0}
    assert 0.05 <= waited < 1.0
    assert len(calls) >= 2  # it asked again while it waited


def test_no_wait_asks_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def nobody(stack: object) -> None:
        calls.append(1)
        return None

    monkeypatch.setattr(chaos, "sliced_guests_held", nobody)
    held, waited = chaos.wait_for_holder(object(), 0.0)
    assert held is None and waited < 0.5
    assert len(calls) == 1
