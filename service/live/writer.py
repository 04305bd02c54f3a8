"""Keeps the GMG in step with the live state: batched writes with a measured lag.

Mutations of :class:`~service.live.state.LiveState` produce :class:`Write` rows; the writer
collects them for up to ``max_delay_s`` (or ``max_rows``), keeps the newest row per object
(rows are whole snapshots), and writes each kind with one ``UNWIND $rows`` statement in a worker
thread. The lag of a row is the time from its mutation to the commit that carries it; the
writer keeps the recent lags for the metrics and the benchmarks.

What goes through here is the GMG's *mirror* of soft state (a lease granted, a request queued
again, a lease that expired). Everything a client or an executor is told is final (an accepted
request, a completion, a cancel) is written synchronously before the answer, so a row lost
here loses nothing anyone was promised. Workflows' progress travels here too (kind
``workflow``: a versioned snapshot of the workflow and its steps, keyed by its uid); their
acceptance, each step's end, cancel and end are written directly (:mod:`service.live.workflows`). During a Neo4j outage rows wait, coalesced per object
(so the backlog is bounded by the number of live objects, not by the number of changes), and
at most ``max_pending`` of them; past that the oldest are dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable

from service.graph.repository import GraphRepository
from service.live import threads
from service.live.records import Write
from service.live.write_loop import gather_and_write, write_all

log = logging.getLogger("slicesched.writer")

_Key = tuple[str, str]  # (kind, uid)


class GmgWriter:
    def __init__(self, repo: GraphRepository, *, max_delay_s: float = 0.2, max_rows: int = 5000,
                 max_pending: int = 500_000, max_commit_s: float = 60.0,
                 on_lag: Callable[[float], None] | None = None) -> None:
        self.repo = repo
        self.max_commit_s = max_commit_s
        self.max_delay_s = max_delay_s
        self.max_rows = max_rows
        self.max_pending = max_pending
        self.on_lag = on_lag
        self.lags_s: deque[float] = deque(maxlen=10_000)
        self.rows_written = 0
        self.rows_dropped = 0
        self.batches = 0
        self.failed_batches = 0
        # Insertion-ordered; a newer row of the same object replaces the older one but keeps
        # the older one's time (the lag counts from the first change not yet written).
        self._pending: dict[_Key, tuple[Write, float]] = {}
        self._wake = asyncio.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def submit(self, writes: Iterable[Write]) -> None:
        now = time.perf_counter()
        for w in writes:
            key = (w.kind, str(w.row["uid"]))
            old = self._pending.get(key)
            if old is not None and w.kind == "slice_new":
                continue  # a slice is created once; its end travels as slice_end
            self._pending[key] = (w, old[1] if old is not None else now)
        while len(self._pending) > self.max_pending:
            del self._pending[next(iter(self._pending))]
            self.rows_dropped += 1
        if self._pending:
            self._wake.set()

    async def tick(self) -> None:
        """One round of the writer loop (run under the service's supervisor): wait up to a
        second for rows, gather more for ``max_delay_s``, write them. A failed write raises (the
        supervisor logs and counts it, and backs off); its rows stay pending."""
        await gather_and_write(self._wake, pending=lambda: self.pending, max_rows=self.max_rows,
                               max_delay_s=self.max_delay_s, write=self._write_batch)

    async def flush(self) -> None:
        """Write everything pending now (shutdown, tests)."""
        await write_all(lambda: self.pending, self._write_batch)

    async def close(self) -> None:
        try:
            await self.flush()
        except Exception:  # Neo4j is gone at shutdown: the rows are soft state, restart rebuilds it
            log.warning("GMG writer closed with %d rows unwritten (Neo4j unreachable)", len(self._pending))

    async def _write_batch(self) -> None:
        keys = list(self._pending)[: self.max_rows]
        batch = [self._pending[k] for k in keys]
        if not batch:
            return
        requests: dict[str, dict[str, object]] = {}
        new: dict[str, dict[str, object]] = {}
        ends: dict[str, dict[str, object]] = {}
        extends: dict[str, dict[str, object]] = {}
        workflows: list[dict[str, object]] = []
        observations: list[dict[str, object]] = []
        for w, _ in batch:  # a slice created and ended in this batch is created ended
            uid = str(w.row["uid"])
            if w.kind == "observation":
                observations.append(w.row)
            elif w.kind == "request":
                requests[uid] = w.row
            elif w.kind == "slice_new":
                new[uid] = dict(w.row)
            elif w.kind == "workflow":
                workflows.append(w.row["snapshot"])
        for w, _ in batch:
            uid = str(w.row["uid"])
            if w.kind == "slice_end":
                if uid in new:
                    new[uid].update(w.row)
                else:
                    ends[uid] = w.row
        for w, _ in batch:  # a renewal past the expected end: moot once ended, folded into a creation
            uid = str(w.row["uid"])
            if w.kind == "slice_extend" and uid not in ends and new.get(uid, {}).get("end_wall") is None:
                if uid in new:
                    new[uid]["end_s"] = max(float(new[uid]["end_s"]), float(w.row["end_s"]))  # type: ignore[arg-type]
                else:
                    extends[uid] = w.row
        try:  # bounded: a hung connection is a failed batch (its rows stay), not a writer that stopped
            await asyncio.wait_for(threads.run(self._commit, list(requests.values()), list(new.values()),
                                               list(ends.values()), workflows, list(extends.values()),
                                               observations),
                                   self.max_commit_s)
        except Exception:
            self.failed_batches += 1
            raise
        done = time.perf_counter()
        for k, (w, t) in zip(keys, batch, strict=True):
            if self._pending.get(k, (None,))[0] is w:  # not replaced by a newer row meanwhile
                del self._pending[k]
            lag = done - t
            self.lags_s.append(lag)
            if self.on_lag is not None:
                self.on_lag(lag)
        self.rows_written += len(requests) + len(new) + len(ends) + len(workflows) + len(extends) + len(observations)
        self.batches += 1

    def _commit(self, requests: list[dict[str, object]], new: list[dict[str, object]],
                ends: list[dict[str, object]], workflows: list[dict[str, object]],
                extends: list[dict[str, object]] | None = None,
                observations: list[dict[str, object]] | None = None) -> None:
        if requests:
            self.repo.live.update_requests(requests)
        if new:
            self.repo.live.create_slices(new)
        if extends:
            self.repo.live.extend_slices(extends)
        if ends:
            self.repo.live.end_slices(ends)
        if workflows:
            self.repo.workflows.update_workflows(workflows)
        if observations:  # after the Slices they land on (a lease's own is created or ended above)
            self.repo.live.record_slice_observations(observations)

    def warm_up(self) -> None:
        """Plan the writer's queries once (empty batches), so the first real batch is not slow."""
        self.repo.live.update_requests([])
        self.repo.live.create_slices([])
        self.repo.live.end_slices([])
        self.repo.live.extend_slices([])
        self.repo.workflows.update_workflows([])
        self.repo.live.record_slice_observations([])
