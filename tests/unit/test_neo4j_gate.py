"""The Neo4j gate's recovery mechanics, without a server: a call whose caller gave up before a
worker thread took it never runs (the queue of abandoned calls that kept a cold Neo4j
overloaded after a restart), and the steps before traffic run once across the watcher's ticks
however long they take (they were bounded per tick, failed and started again every tick)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from service.domain.error import DatabaseUnavailableError
from service.live.neo4j_gate import Neo4jGate


def gate() -> Neo4jGate:
    g = Neo4jGate(SimpleNamespace(call_timeout_s=0.2, db_timeout_s=1.0))  # type: ignore[arg-type]
    g.answered()
    return g


def test_a_call_abandoned_before_it_started_never_runs() -> None:
    ran: list[str] = []
    release = threading.Event()

    async def go() -> str:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))  # one worker thread, kept busy
        g = gate()
        busy = g.in_thread(release.wait, 10.0)
        with pytest.raises(DatabaseUnavailableError) as refused:
            await g.db(ran.append, "abandoned", bound_s=0.1)  # still waiting for the thread at its bound
        queued = g.in_thread(ran.append, "queued")  # a call nobody gave up on runs as before
        release.set()
        await busy
        await queued
        await asyncio.sleep(0.05)
        return str(refused.value)

    assert "not started (nothing was written)" in asyncio.run(go())
    assert ran == ["queued"]


def test_a_call_running_past_its_bound_is_answered_with_an_unknown_outcome() -> None:
    async def go() -> str:
        g = gate()
        with pytest.raises(DatabaseUnavailableError) as late:
            await g.db(threading.Event().wait, 0.5, bound_s=0.05)
        return str(late.value)

    assert "outcome is unknown" in asyncio.run(go())


def test_the_steps_before_traffic_run_once_across_ticks() -> None:
    starts: list[int] = []

    async def steps() -> None:
        starts.append(1)
        await asyncio.sleep(0.3)

    async def go() -> list[bool]:
        g = gate()
        ticks = [await g.reopened(steps, wait_s=0.05) for _ in range(3)]
        while not ticks[-1]:
            ticks.append(await g.reopened(steps, wait_s=0.05))
        return ticks

    ticks = asyncio.run(go())
    assert starts == [1] and ticks[:3] == [False, False, False] and ticks[-1] is True


def test_failed_steps_fail_the_tick_and_start_again_on_the_next() -> None:
    starts: list[int] = []

    async def steps() -> None:
        starts.append(1)
        if len(starts) == 1:
            raise DatabaseUnavailableError("cold")

    async def go() -> bool:
        g = gate()
        with pytest.raises(DatabaseUnavailableError):
            await g.reopened(steps, wait_s=0.5)
        return await g.reopened(steps, wait_s=0.5)

    assert asyncio.run(go()) is True and starts == [1, 1]
