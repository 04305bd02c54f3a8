"""Worker threads the service starts, tracked until they end.

A task awaiting ``asyncio.to_thread`` can be cancelled (a loop stopping, a bound passing), but
its thread runs on. At stop the service waits for them (:func:`drain`) before it closes the
Neo4j driver: a driver closed under a thread still sending on one of its connections corrupts
that connection (``BufferError`` in the driver). Every thread that may touch the driver after
start goes through :func:`run`.

What :func:`run` tracks is the thread, not the caller's wait for it: a caller that gives up
(``asyncio.wait_for`` past its bound, a loop cancelled at stop) cancels only its own wait. Had
the tracked future been the caller's, a cancelled wait would have dropped from the set a thread
still talking to Neo4j, and the stop would have closed the driver under it (the Neo4j watcher's
ping, cancelled with its loop at stop, did so under a loaded machine).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

log = logging.getLogger("slicesched.service")
_running: set[asyncio.Future[Any]] = set()


def run(fn: Callable[..., Any], *args: Any, executor: Executor | None = None, **kwargs: Any) -> asyncio.Future[Any]:
    """``fn(*args, **kwargs)`` in a worker thread; the thread is tracked until it ends, and the
    future returned is the caller's wait for it (cancelling it leaves the thread tracked).
    ``executor``: a pool of the caller's own instead of the event loop's shared one (a few
    threads on a small machine), for a call that must not queue behind the others (the
    leadership's renewal: :class:`service.live.service.LiveService`)."""
    task: asyncio.Future[Any]
    if executor is None:
        task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    else:
        task = asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args, **kwargs))
    _running.add(task)
    task.add_done_callback(_running.discard)
    return asyncio.shield(task)  # the caller's wait: cancelling it leaves the thread tracked


async def drain(timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, for the threads of this event loop that :func:`run` started."""
    loop = asyncio.get_running_loop()
    pending = [t for t in _running if t.get_loop() is loop]
    if pending:
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        if late:
            log.warning("%d worker thread(s) still running %.0f s into the stop", len(late), timeout_s)
