"""Wake-ups between the live service's tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class Signal:
    """Wakes waiting tasks: every one, or only some (:meth:`notify`).

    A waiter takes its handle (:meth:`waiter`) before it checks the state and waits on it after,
    so a notification between the check and the wait is never missed; it :meth:`forget`\\ s the
    handle when it stops waiting. A waiter may name itself (``key``: an executor id), so that a
    notification about work only some can take wakes those, the longest waiting first, rather
    than every long poll at once (a thousand executors woken per submission, of which one or two
    could lease it, was the service's cost at a fleet's size: benchmarks/fleet.py)."""

    def __init__(self) -> None:
        self._waiters: dict[asyncio.Future[None], str | None] = {}  # in the order they began to wait

    def waiter(self, key: str | None = None) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[fut] = key
        return fut

    def forget(self, fut: asyncio.Future[None]) -> None:
        self._waiters.pop(fut, None)

    def notify(self, keys: Iterable[str] | None = None, n: int | None = None) -> None:
        """Wake every waiter (``keys`` None), or the waiters whose key is in ``keys``; at most
        ``n`` of them (None: all), the longest waiting first. Woken waiters are forgotten."""
        wanted = None if keys is None else set(keys)
        woken: list[asyncio.Future[None]] = []
        done: list[asyncio.Future[None]] = []  # cancelled waiters met on the way: dropped, not counted
        for fut, key in self._waiters.items():  # no copy: a wake-up of a few scans only until it has them
            if n is not None and len(woken) >= n:
                break
            if wanted is None or key in wanted:
                (done if fut.done() else woken).append(fut)
        for fut in done:
            del self._waiters[fut]
        for fut in woken:
            del self._waiters[fut]
            fut.set_result(None)

    def waiting(self) -> int:
        return len(self._waiters)
