"""benchmarks/lease_throughput.py's own parts: the pacer that offers the paced phase's rate, and
its argument checks (the phase itself runs against a real service in the benchmark)."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest

from benchmarks.lease_throughput import Pacer, executor_counts, ran_dry


def test_the_pacer_spaces_takes_at_its_rate() -> None:
    async def take_all() -> float:
        pacer = Pacer(rate=400.0)  # 8 leases a take: one take every 20 ms
        t0 = time.perf_counter()
        await asyncio.gather(*(pacer.take(8) for _ in range(6)))
        return time.perf_counter() - t0

    elapsed = asyncio.run(take_all())
    assert elapsed >= 5 * 0.020 - 0.002  # the sixth take waits five intervals, however many ask at once


def test_a_pacer_that_fell_behind_does_not_burst() -> None:
    async def late_takes() -> list[float]:
        pacer = Pacer(rate=100.0)  # one lease every 10 ms
        await pacer.take(1)
        await asyncio.sleep(0.1)  # ten slots missed
        t0 = time.perf_counter()
        times = []
        for _ in range(3):
            await pacer.take(1)
            times.append(time.perf_counter() - t0)
        return times

    times = asyncio.run(late_takes())
    assert times[0] < 0.005  # the first after the gap goes at once
    assert times[2] >= 0.020 - 0.002  # the missed slots are not made up: the next two are spaced again


def test_executor_counts_refuses_what_cannot_run() -> None:
    assert executor_counts("16, 32,64") == [16, 32, 64]
    for bad in ("", "0", "8,-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            executor_counts(bad)


def test_a_phase_that_ran_out_of_queued_requests_is_named() -> None:
    points = [{"executors": 64, "backlog_left": 90_000}, {"executors": 16, "backlog_left": 1},
              {"executors": 32, "backlog_left": 0}, {"executors": 64, "backlog_left": -3}]
    assert ran_dry(points) == [32, 64]
    assert ran_dry(points[:2]) == []
