"""Supervised background loops: a failing tick is logged and counted, never the end of a loop."""

from __future__ import annotations

import asyncio

import pytest

from service.live.log_repeat import RepeatedLineFilter
from service.live.supervisor import Supervisor


def test_a_failing_tick_is_counted_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    async def tick() -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError(f"boom {len(calls)}")

    async def run() -> dict[str, object]:
        sup = Supervisor(backoff_s=0.01)
        sup.spawn("flaky", tick, interval_s=0.01, stuck_after_s=10.0)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if sup.loops["flaky"].ticks >= 3:
                break
        report = sup.report()["flaky"]
        await sup.stop()
        return report

    report = asyncio.run(run())
    assert report["failures"] == 2 and report["ticks"] >= 3 and report["last_error"] is None
    assert report["stuck"] is False
    assert sum("boom" in r.getMessage() or (r.exc_info and "boom" in str(r.exc_info[1])) for r in caplog.records) == 2
    assert all(r.exc_info for r in caplog.records if "flaky" in r.getMessage())  # logged with the traceback


def test_a_loop_with_its_own_back_off_is_asked_again_sooner_than_the_supervisors() -> None:
    """The leadership's loop: a failed renewal is retried at the renewal interval, not after the
    supervisor's back-off (a leader back from an outage must renew before the standby's grace ends)."""
    failed_at: list[float] = []

    async def tick() -> None:
        failed_at.append(asyncio.get_running_loop().time())
        raise RuntimeError("Neo4j unreachable")

    async def run() -> None:
        sup = Supervisor(backoff_s=60.0)
        sup.spawn("leadership", tick, interval_s=0.01, stuck_after_s=10.0, backoff_s=0.01)
        for _ in range(500):
            await asyncio.sleep(0.01)
            if len(failed_at) >= 3:
                break
        await sup.stop()

    asyncio.run(run())
    assert len(failed_at) >= 3  # with the supervisor's 60 s back-off there would be one


def test_a_loop_that_never_succeeds_is_reported_stuck() -> None:
    async def tick() -> None:
        raise ValueError("always")

    async def fine() -> None:
        pass

    async def run() -> tuple[list[str], dict[str, object]]:
        sup = Supervisor(backoff_s=0.01)
        sup.spawn("dead", tick, interval_s=0.01, stuck_after_s=0.05)
        sup.spawn("fine", fine, interval_s=0.01, stuck_after_s=0.05)
        await asyncio.sleep(0.2)
        assert sup.report()["fine"]["failures"] == 0
        out = sup.stuck(), sup.report()["dead"]
        await sup.stop()
        return out

    stuck, dead = asyncio.run(run())
    assert stuck == ["dead"]
    assert dead["failures"] >= 2 and dead["last_error"] == "ValueError: always" and dead["last_ok_s_ago"] is None


def test_stop_ends_a_loop_whose_tick_swallowed_the_cancellation() -> None:
    """On Python 3.11 ``asyncio.wait_for`` can lose a cancellation; stop must still end the loop."""
    swallowed: list[int] = []

    async def tick() -> None:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            swallowed.append(1)  # as the wait_for race does: the loop goes on

    async def run() -> None:
        sup = Supervisor()
        sup.spawn("stubborn", tick, interval_s=0.0, stuck_after_s=10.0)
        await asyncio.sleep(0.02)
        await asyncio.wait_for(sup.stop(), 5.0)

    asyncio.run(run())
    assert swallowed


def test_a_loop_failing_the_same_way_again_and_again_logs_one_line_per_window(
        caplog: pytest.LogCaptureFixture) -> None:
    """An outage fails the leadership's loop every 0.6 s: with serve's repeated-line filter that
    is one line (with its traceback) per window, and a different error still gets through."""
    caplog.handler.addFilter(RepeatedLineFilter(window_s=60.0))  # as serve puts it on its handler
    calls: list[int] = []

    async def tick() -> None:
        calls.append(1)
        raise (ConnectionError("Neo4j unreachable") if len(calls) <= 5 else ValueError("something else"))

    async def run() -> None:
        sup = Supervisor(backoff_s=0.001)
        sup.spawn("leadership", tick, interval_s=0.001, stuck_after_s=10.0)
        for _ in range(500):
            await asyncio.sleep(0.005)
            if len(calls) >= 7:
                break
        await sup.stop()

    asyncio.run(run())
    assert len(calls) >= 7
    texts = [r.getMessage() for r in caplog.records]
    assert texts == ["background loop 'leadership' failed (ConnectionError: Neo4j unreachable); it goes on",
                     "background loop 'leadership' failed (ValueError: something else); it goes on"]
    assert all(r.exc_info for r in caplog.records)
