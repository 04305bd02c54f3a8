"""Worker threads the service starts, tracked until they end.

A task awaiting ``asyncio.to_thread`` can be cancelled (a loop stopping, a bound passing), but
its thread runs on. At stop the service waits for them (:func:`drain`) before it closes the
Neo4j driver: a driver closed under a thread still sending on one of its connections corrupts
that connection (``BufferError`` in the driver). Every thread that may touch the driver after
start goes through :func:`run`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("slicesched.service")
_running: set[asyncio.Future[Any]] = set()


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """``fn(*args, **kwargs)`` in a worker thread, as a future tracked until the thread ends."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    _running.add(task)
    task.add_done_callback(_running.discard)
    return task


async def drain(timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, for the threads of this event loop that :func:`run` started."""
    loop = asyncio.get_running_loop()
    pending = [t for t in _running if t.get_loop() is loop]
    if pending:
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        if late:
            log.warning("%d worker thread(s) still running %.0f s into the stop", len(late), timeout_s)
