"""Supervised background loops: none can die, each is visible.

A loop is a ``tick`` coroutine run again and again. A tick that raises is logged with its
traceback (the same line for the same error, so that a repeated failure is held back by
``slicesched serve``'s repeated-line filter) and counted; the loop goes on after a short back-off. Every loop records when its
last tick succeeded, so readiness can tell a loop that is stuck (no successful tick for
``stuck_after_s``) from one that is merely idle, and ``/metrics`` counts failures per loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("slicesched.supervisor")


@dataclass
class LoopHealth:
    name: str
    interval_s: float  # pause between ticks
    stuck_after_s: float  # no successful tick for this long: the loop is stuck
    backoff_s: float | None = None  # pause after a failed tick (None: the supervisor's)
    started_at: float = field(default_factory=time.monotonic)
    last_ok_at: float | None = None
    ticks: int = 0
    failures: int = 0
    last_error: str | None = None
    running: bool = False

    def stuck(self, now: float) -> bool:
        since = self.last_ok_at if self.last_ok_at is not None else self.started_at
        return now - since > self.stuck_after_s

    def public(self, now: float) -> dict[str, Any]:
        return {"last_ok_s_ago": None if self.last_ok_at is None else round(now - self.last_ok_at, 3),
                "ticks": self.ticks, "failures": self.failures, "last_error": self.last_error,
                "running": self.running, "stuck": self.stuck(now)}


class Supervisor:
    """Owns the service's background tasks; :meth:`stop` cancels them all."""

    def __init__(self, *, backoff_s: float = 1.0) -> None:
        self.backoff_s = backoff_s
        self.loops: dict[str, LoopHealth] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def spawn(self, name: str, tick: Callable[[], Awaitable[None]], *, interval_s: float,
              stuck_after_s: float, backoff_s: float | None = None) -> LoopHealth:
        """Run ``tick`` every ``interval_s`` (after it returns) until :meth:`stop`; after a failed
        tick, ``backoff_s`` later (default the supervisor's)."""
        health = LoopHealth(name, interval_s, stuck_after_s, backoff_s)
        self.loops[name] = health
        self._tasks.append(asyncio.create_task(self._run(health, tick), name=name))
        return health

    async def _run(self, health: LoopHealth, tick: Callable[[], Awaitable[None]]) -> None:
        while not self._stopping:
            health.running = True
            try:
                await tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed tick must never end the loop
                health.failures += 1
                health.last_error = f"{type(exc).__name__}: {exc}"[:500]
                # the same text for the same error, so that serve's repeated-line filter holds an
                # outage's failures back (the count is in /metrics and the health report)
                log.exception("background loop %r failed (%s); it goes on", health.name, health.last_error)
                health.running = False
                await asyncio.sleep(self.backoff_s if health.backoff_s is None else health.backoff_s)
                continue
            health.running = False
            health.ticks += 1
            health.last_ok_at = time.monotonic()
            health.last_error = None
            await asyncio.sleep(health.interval_s)

    def stuck(self) -> list[str]:
        now = time.monotonic()
        return sorted(name for name, h in self.loops.items() if h.stuck(now))

    def report(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        return {name: h.public(now) for name, h in sorted(self.loops.items())}

    async def stop(self) -> None:
        """Cancel every loop and wait for them. A cancellation can be lost (on Python 3.11,
        ``asyncio.wait_for`` swallows one that arrives as its inner wait completes), so loops also
        see the stop flag, and any still running after a second are cancelled again."""
        self._stopping = True
        pending = set(self._tasks)
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        self._tasks.clear()
