"""The live service's audit log: one writer that appends hash-chained entries to Neo4j.

Whoever acts calls :meth:`AuditLog.record` (returns at once; the scheduler's decisions) or
awaits :meth:`AuditLog.append` (returns once the entry is in Neo4j; what a client asked for).
Entries wait in memory in the order they were recorded; the writer (a supervised loop, as the
GMG writer) takes them in batches, gives each its ``seq`` and ``prev_hash`` from the chain's
head, which it keeps in memory, and writes a batch with the head in one transaction. At start
the head is read back from Neo4j (:meth:`recover`), so the chain goes on where it stopped: no
gap, no fork. Another writer on the same graph (a second process) makes a batch fail on the
uniqueness of ``seq``: the writer reads the head again and chains the batch after it. A batch
whose outcome is unknown (the connection broke during the commit) is looked up by its first
entry's seq and hash before it is written again, so it is written once.

What is guaranteed, in a crash (``kill -9``) between an action and its entry:

- an action a client was answered for has its entry in Neo4j: the route awaits it, within
  ``call_timeout_s`` (past that, when Neo4j stalls after the action's own write, the answer goes
  out, a warning is logged, and the entry stays queued until Neo4j takes it);
- an action whose process died before the answer may be in Neo4j without its entry (the
  window is one batch commit, milliseconds);
- a placement decision's entry is written within ``max_delay_s`` of the decision; a crash in that
  window loses the entry together with the decision's effect (replicas live in the process's
  memory and are planned again at restart);
- entries are never reordered, duplicated or skipped; while Neo4j is down they wait (at most
  ``max_pending``; past that the oldest are dropped, counted and logged as errors).

``SLICESCHED_AUDIT=0`` turns recording off (nothing is queued or written; reading and
verifying what is there still work).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from neo4j.exceptions import ConstraintError

from service.core.scheduler import Applied, Decision, WhatIfOutcome
from service.domain.audit import GENESIS, Actor, AuditEntry, AuditRecord, chain, json_text
from service.domain.error import InvariantError
from service.domain.principal import Principal
from service.graph.audit_store import AuditStore
from service.live import threads
from service.live.write_loop import gather_and_write, write_all

log = logging.getLogger("slicesched.audit")


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A commit whose waiter was cancelled may still fail: its error is already handled (the batch
    is looked up before it is written again), not an 'exception was never retrieved'."""
    if not task.cancelled():
        task.exception()


def actor_of(p: Principal, executor_id: str | None = None) -> Actor:
    """Who a key acts as: ``admin``; the tenant's id; an executor key's executor (``executor_id``,
    else its pool)."""
    if p.is_tenant:  # a tenant's own key acts as the tenant; a person's or service's key as itself
        if p.key_id is None:
            return Actor(str(p.tenant_id), "tenant")
        return Actor(f"{p.tenant_id}/{p.key_id}", p.role)
    if p.role == "executor":
        return Actor(executor_id or str(p.pool_id), "executor")
    return Actor(p.role, p.role)


def key_state(key_hash: str | None) -> dict[str, Any]:
    """A key as the audit log shows it: active or revoked, and the first 12 hex digits of its
    hash (which key it was, never the key)."""
    return {"key": "active" if key_hash else "revoked", "key_fingerprint": key_hash[:12] if key_hash else None}


def decision_details(policy: str, decision: Decision, applied: Applied) -> dict[str, Any]:
    """A placement decision in summary: its notes (each reason in a line) and its reasons in
    fields (code, tenant, model, devices, figures), the step's status, what it changed, and every
    what-if it ran with the predicted output tokens and violations without and with the change."""
    def outcome(o: WhatIfOutcome | None) -> dict[str, Any] | None:
        return None if o is None else {"output_tokens": o.output_tokens, "violations_by_model": o.violations_by_tenant,
                                       "memory_violations": o.memory_violations}

    return {"policy": policy, "notes": list(decision.notes), "reasons": [r.as_dict() for r in decision.reasons],
            "status": None if decision.status is None else decision.status.as_dict(),
            "num_whatifs": decision.num_whatifs,
            "added": applied.added, "drained": applied.drained,
            "skipped": [{"model": c.model_uid, "compute_units": list(c.device_ids)} for c in applied.skipped],
            "whatifs": [{"model": r.change.model_uid, "compute_units": list(r.change.device_ids),
                         "horizon_s": r.baseline.horizon_s, "baseline": outcome(r.baseline),
                         "with_change": outcome(r.changed),
                         "gain_tokens": None if r.changed is None else r.changed.output_tokens - r.baseline.output_tokens}
                        for r in decision.whatifs]}


def replica_model(replica_id: str) -> str:
    """The model uid of a replica id (``tenant/model@devices``)."""
    return replica_id.partition("@")[0]


@dataclass
class _Pending:
    record: AuditRecord
    links: dict[str, list[str]]  # tenants, models, pools: what the entry's CONCERNS links point to
    done: asyncio.Future[int] | None = field(default=None, repr=False)  # the seq, once written


class AuditLog:
    """``repo``: where entries go (the service sets it once Neo4j answers); ``enabled``: False
    records nothing (``SLICESCHED_AUDIT=0``); ``wait_s``: how long :meth:`append` waits."""

    def __init__(self, repo: AuditStore | None = None, *, enabled: bool = True, wait_s: float = 10.0,
                 max_delay_s: float = 0.05, max_rows: int = 1000, max_pending: int = 1_000_000,
                 max_commit_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.repo = repo
        self.enabled = enabled
        self.wait_s = wait_s
        self.max_delay_s = max_delay_s
        self.max_rows = max_rows
        self.max_pending = max_pending
        self.max_commit_s = max_commit_s
        self.clock = clock
        self.head: tuple[int, str] = (0, GENESIS)  # the last written entry's (seq, hash)
        self.entries_written = 0
        self.batches = 0
        self.failed_batches = 0
        self.dropped = 0
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._urgent = False  # someone awaits an entry: write without gathering more
        self._stale = False  # the head must be read again before the next batch
        self._unsure: list[list[AuditEntry]] = []  # batches (of the queue's front) whose commit has no known outcome
        self._in_flight = 0  # entries at the queue's front in a batch being written (or unsure)
        self._lock = asyncio.Lock()  # one batch at a time (the loop and flush)
        self._commit: asyncio.Future[int] | None = None  # the commit running in a worker thread

    @property
    def pending(self) -> int:
        return len(self._pending)

    # ---- the chain's head ----------------------------------------------------------------------
    def recover(self) -> tuple[int, str]:
        """Read the head from Neo4j (blocking; run in a thread before the writer starts)."""
        self.head = self._read_head()
        self._stale = False
        return self.head

    def _store(self) -> AuditStore:
        if self.repo is None:
            raise InvariantError("the audit log has no store yet (the service has not started)")
        return self.repo

    def _read_head(self) -> tuple[int, str]:
        """The chain's head in Neo4j: the stored head, or the highest entry when entries go past
        it (then they were appended without it: verify reports them). When the newest entries
        are gone the chain goes on after the head, and the gap stays visible to verify."""
        h = self._store().audit_head()
        stored = (int(h["head_seq"]), str(h["head_hash"])) if h["head_seq"] is not None else (0, GENESIS)
        last = (int(h["last_seq"]), str(h["last_hash"])) if h["last_seq"] is not None else (0, GENESIS)
        if last[0] > stored[0]:
            log.warning("audit entries go past the stored head (seq %d > %d): the chain goes on after seq %d; "
                        "run 'slicesched audit verify'", last[0], stored[0], last[0])
            return last
        if last != stored:
            log.error("the audit chain's newest entries are not where its head says (head seq %d, last entry "
                      "seq %d): the chain goes on after the head; run 'slicesched audit verify'", stored[0], last[0])
        return stored

    # ---- recording -----------------------------------------------------------------------------
    def record(self, actor: Actor, action: str, target_kind: str, target_id: str | None = None,
               tenant_id: str | None = None, before: Any = None, after: Any = None, details: Any = None, *,
               models: Iterable[str] = (), pools: Iterable[str] = (), tenants: Iterable[str] = (),
               wait: bool = False) -> asyncio.Future[int] | None:
        """Queue an entry (call on the event loop; returns at once). ``before``, ``after`` and
        ``details`` are anything JSON can hold (figures, lists, maps); ``models``, ``pools``
        and ``tenants`` (besides ``tenant_id``) name the nodes the entry is linked to. With
        ``wait``, a future that gets the entry's seq once it is written; None when disabled."""
        if not self.enabled:
            return None
        rec = AuditRecord(self.clock(), actor.actor_id, actor.role, action, target_kind, target_id, tenant_id,
                          json_text(before), json_text(after), json_text(details))
        links = {"tenants": sorted({*tenants, *([tenant_id] if tenant_id else [])}), "models": sorted(set(models)),
                 "pools": sorted(set(pools))}
        done = asyncio.get_running_loop().create_future() if wait else None
        self._pending.append(_Pending(rec, links, done))
        while len(self._pending) > max(self.max_pending, self._in_flight):
            lost = self._pending[self._in_flight]  # the oldest not being written
            del self._pending[self._in_flight]
            self.dropped += 1
            log.error("audit entry dropped (%d waiting while Neo4j is unreachable): %s %s", len(self._pending),
                      lost.record.action, lost.record.target_id)
            if lost.done is not None and not lost.done.done():
                lost.done.cancel()
        self._urgent = self._urgent or wait
        self._wake.set()
        return done

    async def append(self, actor: Actor, action: str, target_kind: str, target_id: str | None = None,
                     tenant_id: str | None = None, before: Any = None, after: Any = None, details: Any = None, *,
                     models: Iterable[str] = (), pools: Iterable[str] = (), tenants: Iterable[str] = ()) -> int | None:
        """:meth:`record`, then wait (at most ``wait_s``) until the entry is in Neo4j: its seq, or
        None (disabled, or not written in time: it stays queued, and a warning is logged)."""
        done = self.record(actor, action, target_kind, target_id, tenant_id, before, after, details,
                           models=models, pools=pools, tenants=tenants, wait=True)
        if done is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(done), self.wait_s)
        except TimeoutError:
            log.warning("audit entry %s %s not written within %.1f s; it stays queued", action, target_id, self.wait_s)
            return None
        except asyncio.CancelledError:
            if done.cancelled():  # dropped from a full queue (logged there); the caller goes on
                return None
            raise

    # ---- the writer ----------------------------------------------------------------------------
    async def tick(self) -> None:
        """One round of the writer loop (run under the service's supervisor): wait up to a second
        for entries, gather more for ``max_delay_s`` unless one is awaited, write a batch. A failed
        write raises (the supervisor logs, counts and backs off); its entries stay queued."""
        await gather_and_write(self._wake, pending=lambda: self.pending, max_rows=self.max_rows,
                               max_delay_s=self.max_delay_s, write=self._write_batch, urgent=lambda: self._urgent)

    async def flush(self) -> None:
        """Write everything queued now (shutdown, tests)."""
        await write_all(lambda: self.pending, self._write_batch)

    async def close(self) -> None:
        """Write what is queued (after the loop stopped). A commit the stop interrupted runs on in
        its thread: it is waited for first (the driver must not close under it), then looked up."""
        if self._commit is not None:
            await asyncio.wait([self._commit], timeout=self.max_commit_s)
        try:
            await self.flush()
        except Exception:
            log.error("audit log closed with %d entries unwritten (Neo4j unreachable): they are lost", self.pending)

    async def _write_batch(self) -> None:
        async with self._lock:
            self._urgent = False
            if self._stale or self._unsure:
                landed, head = await asyncio.wait_for(threads.run(self._resync, self._unsure), self.max_commit_s)
                if landed is not None:
                    self._written(landed)
                    self._unsure = []
                self.head, self._stale = head, False
                self._in_flight = max((len(u) for u in self._unsure), default=0)
            batch = [self._pending[i] for i in range(min(self.max_rows, len(self._pending)))]
            if not batch:
                return
            entries = chain([p.record for p in batch], *self.head)
            rows = [{"entry": e.row(), **p.links} for e, p in zip(entries, batch, strict=True)]
            self._in_flight = len(batch)
            self._commit = threads.run(self._store().append_audit_entries, rows, (entries[-1].seq, entries[-1].hash))
            self._commit.add_done_callback(_retrieve)
            try:  # bounded: a hung connection is a failed batch (its entries stay), not a writer that stopped
                await asyncio.wait_for(asyncio.shield(self._commit), self.max_commit_s)
            except ConstraintError:  # another writer (or our own unanswered batch) took these seqs
                log.warning("audit seq %d is taken (another writer on this graph): chaining after it", entries[0].seq)
                self._stale, self._urgent = True, True
                return
            except BaseException:
                self.failed_batches += 1
                self._unsure.append(entries)  # it may have committed all the same: looked up before a retry
                raise
            self._written(entries)  # an unsure batch before it can no longer land: its seqs are taken
            self.head, self._in_flight, self._unsure = (entries[-1].seq, entries[-1].hash), 0, []

    def _written(self, entries: list[AuditEntry]) -> None:
        """The queue's first ``len(entries)`` entries are in Neo4j as ``entries``."""
        for e in entries:
            p = self._pending.popleft()
            if p.done is not None and not p.done.done():
                p.done.set_result(e.seq)
        self.entries_written += len(entries)
        self.batches += 1

    def _resync(self, unsure: list[list[AuditEntry]]) -> tuple[list[AuditEntry] | None, tuple[int, str]]:
        """Before writing again (in a thread): which batch whose outcome was unknown is in Neo4j
        (its first entry's seq holds its hash; at most one can be), and the head read again."""
        landed = None
        for entries in unsure:
            found = self._store().audit_page(entries[0].seq - 1, 1)
            if found and found[0][0] == entries[0].seq and found[0][-1] == entries[0].hash:
                log.warning("an audit batch whose commit went unanswered was written (seq %d-%d)", entries[0].seq,
                            entries[-1].seq)
                landed = entries
                break
        return landed, self._read_head()

    def report(self) -> dict[str, Any]:
        """For readiness and the stats: on or off, queued, written, dropped, the head's seq."""
        return {"enabled": self.enabled, "pending": self.pending, "written": self.entries_written,
                "dropped": self.dropped, "failed_batches": self.failed_batches, "head_seq": self.head[0]}
