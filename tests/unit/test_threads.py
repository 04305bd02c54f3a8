"""The service's worker threads: the stop waits for every one still running, whoever gave up on it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.live import threads


def test_a_thread_whose_caller_gave_up_is_still_waited_for_at_stop() -> None:
    async def main() -> None:
        release, ended = threading.Event(), threading.Event()

        def work() -> int:
            release.wait(5.0)  # a Neo4j call still on the wire
            ended.set()
            return 1

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(threads.run(work), 0.05)  # the caller's bound passed: its wait is cancelled
        asyncio.get_running_loop().call_later(0.2, release.set)
        await threads.drain(5.0)  # the stop, before it closes the driver
        assert ended.is_set()

    asyncio.run(main())


def test_a_waited_thread_gives_its_result_or_its_error() -> None:
    async def main() -> None:
        assert await threads.run(lambda x: x + 1, 2) == 3
        with pytest.raises(ValueError, match="bad"):
            await threads.run(_fail)
        await threads.drain(1.0)

    asyncio.run(main())


def _fail() -> None:
    raise ValueError("bad")


def test_a_call_on_its_own_pool_runs_while_the_shared_pool_is_full_and_is_waited_for_at_stop() -> None:
    """The leadership's asks run on a pool of their own: every shared worker thread busy (calls
    waiting out a Neo4j outage) does not hold them up, and the stop still waits for them."""
    from concurrent.futures import ThreadPoolExecutor

    async def main() -> None:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        clog = [loop.run_in_executor(None, release.wait, 10.0) for _ in range(64)]  # any default pool's size
        own = ThreadPoolExecutor(1, thread_name_prefix="own")
        try:
            name = await asyncio.wait_for(threads.run(lambda: threading.current_thread().name, executor=own), 5.0)
            assert name.startswith("own")
            ended = threading.Event()

            def late() -> None:
                release.wait(10.0)
                ended.set()

            with pytest.raises(TimeoutError):
                await asyncio.wait_for(threads.run(late, executor=own), 0.05)
            loop.call_later(0.2, release.set)
            await threads.drain(5.0)
            assert ended.is_set()
        finally:
            release.set()
            await asyncio.gather(*clog)
            own.shutdown()

    asyncio.run(main())
