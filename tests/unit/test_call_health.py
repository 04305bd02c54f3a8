"""The lease path's health for readiness: failing after a streak of 503s, healthy again after one
success or a quiet window (a fake clock, so the windows are the test's)."""

from __future__ import annotations

import pytest

from service.live.call_health import CallHealth


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_a_streak_of_failures_is_failing_until_a_success() -> None:
    clock = FakeClock()
    h = CallHealth(streak=3, window_s=30.0, clock=clock)
    assert not h.failing() and h.report() == {"failing": False, "failures_in_a_row": 0, "last_failure_s_ago": None,
                                              "last_error": None}
    h.failed("late")
    h.failed("late")
    assert not h.failing()  # two in a row: not yet
    h.succeeded()
    h.failed("late")
    h.failed("late")
    assert not h.failing()  # the success broke the streak
    h.failed("a call found no answer within 10 s")
    clock.now += 1.5
    assert h.failing() and h.report() == {"failing": True, "failures_in_a_row": 3, "last_failure_s_ago": 1.5,
                                          "last_error": "a call found no answer within 10 s"}
    h.succeeded()
    assert not h.failing()


def test_a_quiet_window_ends_it() -> None:
    clock = FakeClock()
    h = CallHealth(streak=2, window_s=30.0, clock=clock)
    h.failed("x")
    h.failed("x")
    clock.now += 29.9
    assert h.failing()
    clock.now += 0.2
    assert not h.failing()  # no call failed for 30 s (nor succeeded: a not-ready service gets no traffic)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        CallHealth(streak=0)
