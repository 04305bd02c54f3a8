"""Keeps the GMG in step with the live state: batched writes with a measured lag.

Mutations of :class:`~service.api.state.LiveState` produce :class:`Write` rows; the writer
collects them for up to ``max_delay_s`` (or ``max_rows``), keeps the newest row per object
(rows are whole snapshots), and writes each kind with one ``UNWIND $rows`` statement in a worker
thread. The lag of a row is the time from its mutation to the commit that carries it; the
writer keeps the recent lags for the metrics and the benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable

from service.api.state import Write
from service.graph.repository import GraphRepository

log = logging.getLogger("slicesched.writer")


class GmgWriter:
    def __init__(self, repo: GraphRepository, *, max_delay_s: float = 0.2, max_rows: int = 5000,
                 on_lag: Callable[[float], None] | None = None) -> None:
        self.repo = repo
        self.max_delay_s = max_delay_s
        self.max_rows = max_rows
        self.on_lag = on_lag
        self.lags_s: deque[float] = deque(maxlen=10_000)
        self.rows_written = 0
        self.batches = 0
        self._pending: list[tuple[Write, float]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gmg-writer")

    def submit(self, writes: Iterable[Write]) -> None:
        now = time.perf_counter()
        for w in writes:
            self._pending.append((w, now))
        if self._pending:
            self._wake.set()

    async def flush(self) -> None:
        """Write everything pending now (shutdown, tests)."""
        while self._pending:
            await self._write_batch()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self.flush()

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                break
            deadline = time.perf_counter() + self.max_delay_s
            while len(self._pending) < self.max_rows and time.perf_counter() < deadline and not self._closing:
                await asyncio.sleep(min(0.01, self.max_delay_s))
            try:
                await self._write_batch()
            except Exception: # the writer must outlive a failed batch; it retries
                log.exception("GMG write failed; retrying in 1 s")
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _write_batch(self) -> None:
        batch, self._pending = self._pending[: self.max_rows], self._pending[self.max_rows:]
        if not batch:
            return
        requests: dict[str, dict[str, object]] = {}
        new: dict[str, dict[str, object]] = {}
        ends: dict[str, dict[str, object]] = {}
        for w, _ in batch:  # the newest row per object; a slice created and ended here is created ended
            uid = str(w.row["uid"])
            if w.kind == "request":
                requests[uid] = w.row
            elif w.kind == "slice_new":
                new[uid] = dict(w.row)
            elif uid in new:
                new[uid].update(w.row)
            else:
                ends[uid] = w.row
        try:
            await asyncio.to_thread(self._commit, list(requests.values()), list(new.values()), list(ends.values()))
        except Exception:
            self._pending = batch + self._pending  # nothing is lost: the rows go again
            raise
        done = time.perf_counter()
        for _, t in batch:
            lag = done - t
            self.lags_s.append(lag)
            if self.on_lag is not None:
                self.on_lag(lag)
        self.rows_written += len(requests) + len(new) + len(ends)
        self.batches += 1

    def _commit(self, requests: list[dict[str, object]], new: list[dict[str, object]],
                ends: list[dict[str, object]]) -> None:
        if requests:
            self.repo.update_requests(requests)
        if new:
            self.repo.create_slices(new)
        if ends:
            self.repo.end_slices(ends)

    def warm_up(self) -> None:
        """Plan the writer's queries once (empty batches), so the first real batch is not slow."""
        self.repo.update_requests([])
        self.repo.create_slices([])
        self.repo.end_slices([])
