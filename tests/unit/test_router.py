"""The tail router that does not herd (service.core.router): simultaneous calls spread over the
replicas, a replica that cannot admit is never chosen, dispatched work comes off when a call
finishes, ties go by load."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.router import Candidate, PowerOfDRouter
from service.domain.error import InvalidInputError


def _flat(looked: Sequence[Candidate]) -> list[float]:
    """A prediction that does not move with dispatches (a stale snapshot, a flat predictor)."""
    return [5.0] * len(looked)


def _burst(router: PowerOfDRouter, n_calls: int, n_replicas: int) -> Counter[str]:
    cands = [Candidate(f"r{i}", load=0, slots=1) for i in range(n_replicas)]
    return Counter(router.choose(f"c{k}", cands, _flat, 1.0) for k in range(n_calls))


def test_calls_released_together_spread_over_the_replicas() -> None:
    # every candidate looked at, dispatched work counted: exactly even
    assert set(_burst(PowerOfDRouter(np.random.default_rng(0), d=0), 64, 8).values()) == {8}
    # two choices: near even (the two-choice bound: log log n above the mean), on every seed
    for seed in range(20):
        counts = _burst(PowerOfDRouter(np.random.default_rng(seed), d=2), 64, 8)
        assert len(counts) == 8 and max(counts.values()) <= 8 + 2
    # the herd it breaks: the argmin of a flat prediction sends the whole burst to one replica
    herd = _burst(PowerOfDRouter(np.random.default_rng(0), d=0, count_outstanding=False), 64, 8)
    assert herd == Counter({"r0": 64})


def test_a_prediction_that_prefers_one_replica_still_spreads_once_its_promised_work_outweighs_it() -> None:
    router = PowerOfDRouter(np.random.default_rng(1), d=0)
    cands = [Candidate("fast", 0, slots=4), Candidate("slow", 0, slots=4)]

    def predict(looked: Sequence[Candidate]) -> list[float]:
        return [1.0 if c.replica_id == "fast" else 3.0 for c in looked]

    picks = [router.choose(f"c{k}", cands, predict, 2.0) for k in range(12)]
    # each call adds 2 s / 4 slots = 0.5 s to its replica: the fast one takes four before the slow one gets a call
    assert picks[:5] == ["fast"] * 5 and picks[5] == "slow"
    assert Counter(picks) == Counter({"fast": 8, "slow": 4})


def test_finished_takes_the_work_off_and_a_rerouted_call_moves_it() -> None:
    router = PowerOfDRouter(np.random.default_rng(0), d=0)
    cands = [Candidate("a", 0), Candidate("b", 0)]
    assert router.choose("x", cands, _flat, 3.0) == "a"
    assert router.outstanding_s("a") == pytest.approx(3.0)
    assert router.choose("y", cands, _flat, 2.0) == "b"
    router.finished("x")
    assert router.outstanding_s("a") == 0.0
    router.finished("x")  # twice, or an unknown id: nothing
    router.finished("nope")
    assert router.choose("y", [Candidate("a", 0, can_admit=True)], _flat, lambda rid: 4.0) == "a"  # requeued
    assert router.outstanding_s("b") == 0.0 and router.outstanding_s("a") == pytest.approx(4.0)


def test_equal_scores_go_to_the_replica_with_fewer_requests() -> None:
    router = PowerOfDRouter(np.random.default_rng(0), d=0, count_outstanding=False)
    cands = [Candidate("busy", 9), Candidate("idle", 2), Candidate("mid", 5)]
    assert router.choose("x", cands, _flat, 1.0) == "idle"


@settings(max_examples=80, deadline=None)
@given(admits=st.lists(st.booleans(), min_size=1, max_size=8), d=st.integers(0, 4), seed=st.integers(0, 2**16),
       preds=st.lists(st.floats(0.0, 100.0), min_size=8, max_size=8), calls=st.integers(1, 12))
def test_routing_never_sends_to_a_replica_that_cannot_admit(admits: list[bool], d: int, seed: int,
                                                           preds: list[float], calls: int) -> None:
    router = PowerOfDRouter(np.random.default_rng(seed), d=d)
    cands = [Candidate(f"r{i}", i % 3, 2, ok) for i, ok in enumerate(admits)]
    by_id = {c.replica_id: preds[i] for i, c in enumerate(cands)}

    def predict(looked: Sequence[Candidate]) -> list[float]:
        assert all(c.can_admit for c in looked)  # it never even asks about one that cannot admit
        return [by_id[c.replica_id] for c in looked]

    for k in range(calls):
        if not any(admits):
            with pytest.raises(InvalidInputError, match="no replica can admit"):
                router.choose(f"c{k}", cands, predict, 1.0)
            continue
        chosen = router.choose(f"c{k}", cands, predict, 1.0)
        assert admits[int(chosen[1:])]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="d must be"):
        PowerOfDRouter(np.random.default_rng(0), d=-1)
    router = PowerOfDRouter(np.random.default_rng(0))
    with pytest.raises(InvalidInputError, match="predictions"):
        router.choose("x", [Candidate("a", 0)], lambda looked: [], 1.0)
