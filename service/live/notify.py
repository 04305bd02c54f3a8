"""Wake-ups between the live service's tasks."""

from __future__ import annotations

import asyncio


class Signal:
    """Wakes every waiter at once: waiters take :meth:`event` before checking the state, so a
    notification between the check and the wait is never missed."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def event(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()
