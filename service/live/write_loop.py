"""The round of a batching writer (the GMG writer, the audit log): wait for work, gather more
for a short while, write one batch; the same rule for both, stated once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable


async def gather_and_write(wake: asyncio.Event, *, pending: Callable[[], int], max_rows: int, max_delay_s: float,
                           write: Callable[[], Awaitable[None]], urgent: Callable[[], bool] = lambda: False,
                           idle_s: float = 1.0) -> None:
    """Wait up to ``idle_s`` for ``wake``; if anything is pending, gather more for up to
    ``max_delay_s`` (until ``max_rows`` are pending, or at once when ``urgent()``), then
    ``write()`` one batch. A failed write raises (the supervisor running the loop logs, counts and
    backs off) and its rows stay pending; whatever is still pending wakes the next round."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), idle_s)
    wake.clear()
    if not pending():
        return
    deadline = time.perf_counter() + max_delay_s
    while not urgent() and pending() < max_rows and time.perf_counter() < deadline:
        await asyncio.sleep(min(0.01, max_delay_s))
    try:
        await write()
    finally:
        if pending():
            wake.set()


async def write_all(pending: Callable[[], int], write: Callable[[], Awaitable[None]]) -> None:
    """Write batches until nothing is pending (shutdown, tests)."""
    while pending():
        await write()
