"""The live service: state, persistence and the scheduler loop behind the HTTP API.

:class:`LiveService` owns the Neo4j driver, the :class:`~service.api.state.LiveState` mirror,
the batched :class:`~service.api.writer.GmgWriter` and three background tasks: lease expiry,
the scheduler (the same ``Scheduler.step`` as replay, run on arrivals and completions at most
every ``schedule_interval_s``, in a worker thread on a snapshot), and replica clean-up. At start
it rebuilds its state from Neo4j: tenants (with key hashes), models, and every request that was
accepted and not finished, queued again (leases of the previous process are void).

Placement: ``container`` gives each served model whole devices in proportion to its tenant's
weight (the same allocation as replay; when there are more models than devices, the extra ones
share the least loaded device). ``slice`` starts from the same homes and adds guest replicas
where the what-if simulator says it pays, found by the Cypher candidate-slot search on the GMG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from learned.artifact import load_cost_model
from service.api.keys import ExecutorPools
from service.api.live_view import LIVE_CLUSTER, LiveClusterView, LiveSnapshot, live_spec
from service.api.metrics import LiveMetrics
from service.api.settings import ServiceSettings
from service.api.state import (
    LIVE_FAMILIES,
    TERMINAL,
    Completion,
    LiveModel,
    LiveRequest,
    LiveState,
    Write,
)
from service.api.supervisor import Supervisor
from service.api.writer import GmgWriter
from service.core.placement import TenantDemand, candidate_groups, container_replicas, make_placement_policy
from service.core.queue import make_queue_policy
from service.core.scheduler import Decision, DeviceInfo, ReplicaInfo, Scheduler
from service.core.slot import InputDep, Slot, SlotQuery
from service.domain.cluster import ClusterSpec
from service.domain.error import ConflictError, DatabaseUnavailableError, InvalidInputError, Neo4jServerError
from service.domain.request import RequestSpec, RequestStatus
from service.graph.catalog import QueryCatalog
from service.graph.connection import Neo4jSettings, open_driver
from service.graph.repository import GraphRepository
from service.models.family import MODEL_CONFIGS
from service.sim.iteration import weight_bytes

log = logging.getLogger("slicesched.service")

RECOVER_FINISHED_S = 24 * 3600.0  # finished requests loaded at start (for status queries)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A call whose caller stopped waiting (503 past its bound) may still fail later: its error
    is logged here, not left to asyncio's 'exception was never retrieved'."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a Neo4j call failed after its caller was answered: %r", task.exception())


def _neo4j_down(exc: BaseException) -> bool:
    from neo4j.exceptions import ServiceUnavailable, SessionExpired

    return isinstance(exc, ServiceUnavailable | SessionExpired | ConnectionError | TimeoutError)


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


class LiveService:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.cost_model = load_cost_model(settings.cost_model).model  # the what-if mirror's; never a fallback
        self.started = time.monotonic()
        self.state = LiveState(make_queue_policy(settings.queue), clock=time.monotonic, wall=time.time,
                               lease_ttl_s=settings.lease_ttl_s, max_attempts=settings.max_attempts,
                               max_batch=settings.max_batch)
        self.metrics = LiveMetrics(self.state)
        self.pools = ExecutorPools(settings.executor_key, settings.executor_kinds)  # executor keys
        self.driver: Any = None
        self.neo4j_uri: str | None = None
        self.previous_neo4j_uri: str | None = None
        self.repo: GraphRepository | None = None
        self.writer: GmgWriter | None = None
        placement = make_placement_policy(settings.placement)
        if settings.placement == "slice":
            placement.find_devices = self._cypher_candidates  # type: ignore[union-attr]
        self.scheduler = Scheduler(self.state.policy, placement)
        self.supervisor = Supervisor()
        self.metrics.watch(self._health_metrics)
        self.work = Signal()  # notified when leases may be granted
        self.changed = asyncio.Event()  # set on arrivals and completions (the scheduler's trigger)
        self.decisions: list[str] = []
        self.step_s: list[float] = []  # wall time of each scheduler step (what-ifs included)
        self.unplaced: dict[str, str] = {}  # model uid -> why the last re-plan found it no home
        self.db_up = False
        self.db_error: str | None = None
        self._gmg_dirty = False  # the cluster's devices and weights in the GMG await a re-write
        self._busy_mark: dict[str, tuple[float, float]] = {}
        self._replan_lock = asyncio.Lock()  # one re-plan at a time: they rewrite the same devices
        self._submitting: dict[tuple[str, str], asyncio.Future[None]] = {}  # idempotency keys in flight
        self._unsettled: set[str] = set()  # requests whose end's write has no clear outcome yet
        self._completion_batch: list[tuple[list[dict[str, Any]], Any, asyncio.Future[BaseException | None]]] = []
        self._completion_flush: asyncio.Future[None] | None = None  # the group commit in flight

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.driver = await asyncio.to_thread(self._open_driver, True)
        self.repo = GraphRepository(self.driver, QueryCatalog.load(), database=self.settings.neo4j.database)
        self.db_up = True
        await asyncio.to_thread(self.repo.apply_schema)
        await self._recover()
        self.pools.recover(await asyncio.to_thread(self.repo.live_executor_pools))
        self.writer = GmgWriter(self.repo, on_lag=self.metrics.write_lag.observe,
                                max_pending=self.settings.max_pending_writes)
        await asyncio.to_thread(self.writer.warm_up)
        sup = self.supervisor
        sup.spawn("lease-expiry", self._expiry_tick, interval_s=min(0.5, self.settings.lease_ttl_s / 4),
                  stuck_after_s=30.0)
        sup.spawn("scheduler", self._schedule_tick, interval_s=self.settings.schedule_interval_s,
                  stuck_after_s=300.0)
        sup.spawn("gmg-writer", self.writer.tick, interval_s=0.0, stuck_after_s=60.0)
        sup.spawn("retention", self._retention_tick, interval_s=600.0, stuck_after_s=1800.0)
        sup.spawn("neo4j-watch", self._neo4j_tick, interval_s=1.0, stuck_after_s=60.0)

    async def stop(self) -> None:
        await self.supervisor.stop()
        if self.writer is not None:
            await self.writer.close()
        if self.driver is not None:
            await asyncio.to_thread(self.driver.close)

    def _open_driver(self, start: bool, resolved: Neo4jSettings | None = None) -> Any:
        """A verified driver to the configured server (the managed one: wherever its state says
        it runs now, with its credentials), with timeouts that fail a call within about
        ``db_timeout_s`` when it is down. :attr:`neo4j_uri` changes only once it answers."""
        t = self.settings.db_timeout_s
        resolved = resolved or self.settings.neo4j.resolved(start=start)
        driver = open_driver(resolved, connection_timeout=t, connection_acquisition_timeout=t,
                             max_transaction_retry_time=t)
        self.previous_neo4j_uri, self.neo4j_uri = self.neo4j_uri, resolved.uri
        return driver

    async def _recover(self) -> None:
        """Rebuild the live state from the GMG and reconcile what a previous process left: its
        open Slices are closed (their leases died with it), every unfinished request is queued
        again with the leases it was granted counted as attempts."""
        repo = self.repo
        assert repo is not None
        closed = await asyncio.to_thread(repo.close_open_slices, time.time())
        if closed:
            log.info("closed %d slices left open by a previous process", closed)
        for t in await asyncio.to_thread(repo.live_tenants):
            self.state.add_tenant(t["tenant_id"], t["sla_class"] or "standard", float(t["weight"] or 1.0),
                                  int(t["priority"] or 0), t["key_hash"])
        for m in await asyncio.to_thread(repo.live_models):
            self.state.add_model(LiveModel(m["tenant_id"], m["model_id"], m["family"], int(m["seed"]),
                                           int(m["replicas"] or 1)))
        rows = await asyncio.to_thread(repo.live_requests, time.time() - RECOVER_FINISHED_S)
        requeued = 0
        for row in rows:
            req = LiveRequest(row["uid"], row["tenant_id"], row["model_id"], list(row["prompt"]),
                              int(row["max_tokens"]), row["sla_class"], int(row["token_budget"]),
                              float(row["arrival"]), status=RequestStatus(row["status"]),
                              attempts=max(int(row.get("attempts") or 0), int(row.get("slices") or 0)),
                              output_tokens=list(row.get("output_tokens") or []), queued_s=row.get("queued_s"),
                              ttft_s=row.get("ttft_s"), e2e_s=row.get("e2e_s"), finished_at=row.get("finished_at"),
                              error=row.get("error"), idempotency_key=row.get("idempotency_key"),
                              body_sha=row.get("body_sha"))
            if req.model_uid not in self.state.models:
                continue
            requeued += req.status not in TERMINAL
            self.state.accept(req)
        if rows:
            log.info("recovered %d requests from Neo4j (%d queued again)", len(rows), requeued)
        self.work.notify()

    # ---- Neo4j: fail fast, follow it, keep the mirror in step --------------------------------
    async def db(self, fn: Any, *args: Any, bound_s: float | None = -1.0, **kwargs: Any) -> Any:
        """Run a repository call in a worker thread, failing fast when Neo4j is down: a
        :class:`DatabaseUnavailableError` (503 with ``Retry-After``) at once when the watcher
        knows it is down, within ``db_timeout_s`` when it cannot be reached, or when the call
        does not end within ``bound_s`` (default ``call_timeout_s``; None: no bound, for long
        work such as tracing a model)."""
        self._check_db()
        task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        task.add_done_callback(_retrieve)
        return await self._bounded(task, self.settings.call_timeout_s if bound_s == -1.0 else bound_s)

    def _check_db(self) -> None:
        if not self.db_up:
            raise DatabaseUnavailableError(f"Neo4j is unreachable ({self.db_error or 'reconnecting'})",
                                           retry_after_s=self.settings.db_timeout_s)

    async def _bounded(self, task: asyncio.Future[Any], bound_s: float | None) -> Any:
        """Await ``task`` for at most ``bound_s``; past that the caller gets a 503 while the
        task runs on (its outcome is unknown to the caller)."""
        try:
            return await asyncio.wait_for(asyncio.shield(task), bound_s)
        except TimeoutError:
            log.warning("a Neo4j call took longer than %.1f s; answered 503", bound_s)
            raise DatabaseUnavailableError("Neo4j did not answer in time; the outcome is unknown (retry with the "
                                           "same Idempotency-Key)", retry_after_s=self.settings.db_timeout_s) from None
        except Exception as exc:
            if _neo4j_down(exc):
                self._db_failed(f"{type(exc).__name__}: {exc}")
                raise DatabaseUnavailableError(f"Neo4j is unreachable: {type(exc).__name__}",
                                               retry_after_s=self.settings.db_timeout_s) from None
            raise

    def _db_failed(self, why: str) -> None:
        if self.db_up:
            log.warning("Neo4j unreachable (%s): failing fast until it answers again", why)
        self.db_up, self.db_error = False, why[:300]

    async def _neo4j_tick(self) -> None:
        """Check that Neo4j answers; when it does not, find where the managed server runs now
        (a restart may have moved it to another port) and reconnect. Then bring the GMG's view
        of the cluster up to date if a re-plan could not write it. Every call is bounded, so a
        hung connection shows as a failed tick, never as a watcher that stopped watching."""
        ok = await self._watch_call(self._ping)
        if not ok and self.settings.neo4j.managed:
            await self._watch_call(self._follow_managed)
            ok = await self._watch_call(self._ping)
        if ok and not self.db_up:
            assert self.writer is not None
            await self._watch_call(self.writer.warm_up)  # plan the hot queries before taking traffic
            log.info("Neo4j answers again at %s", self.neo4j_uri)
        if ok and self._unsettled:  # before taking traffic again: an executor's retry then meets a settled request
            await self._reconcile()
        self.db_up = ok
        if ok:
            self.db_error = None
            if self._gmg_dirty:
                await self._write_cluster()

    async def _reconcile(self) -> None:
        """Requests whose end was written without a clear answer: adopt what Neo4j holds (done,
        cancelled or failed: memory follows, nothing runs them again), else release the claim."""
        assert self.repo is not None
        repo = self.repo
        uids = sorted(self._unsettled)
        stored: dict[str, dict[str, Any]] = await self._watch_call(lambda: repo.request_results(uids))
        for uid in uids:
            self._unsettled.discard(uid)
            req = self.state.requests.get(uid)
            if req is None or req.status in TERMINAL:
                continue
            row = stored.get(uid)
            if row is not None and row["status"] in TERMINAL:
                log.warning("request %s is %s in Neo4j: memory follows", uid, row["status"])
                self.persist(self.state.adopt(req, row))
                if req.status == "done":
                    self.metrics.finished_request(req)
            else:
                self.state.abandon_finish(req)
        self.work.notify()
        self.changed.set()

    async def _watch_call(self, fn: Any) -> Any:
        bound = 3 * self.settings.db_timeout_s + 2.0
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn), bound)
        except TimeoutError:
            raise DatabaseUnavailableError(f"the Neo4j watcher's {fn.__name__} took longer than {bound:.0f} s") from None

    def _ping(self) -> bool:
        try:
            self.driver.verify_connectivity()
            return True
        except Exception as exc:
            self.db_error = f"{type(exc).__name__}: {exc}"[:300]
            return False

    def _follow_managed(self) -> None:
        try:
            resolved = self.settings.neo4j.resolved(start=False)
        except Neo4jServerError:  # not running (yet)
            return
        if resolved.uri == self.neo4j_uri:
            return
        try:
            driver = self._open_driver(False, resolved)
        except Exception as exc:
            if not _neo4j_down(exc):
                raise
            self.db_error = f"the managed Neo4j moved to {resolved.uri} and does not answer there yet"
            return  # still starting: the next tick tries again
        log.warning("the managed Neo4j now runs at %s (was %s): reconnected", resolved.uri, self.previous_neo4j_uri)
        old, self.driver = self.driver, driver
        assert self.repo is not None
        self.repo.driver = self.driver
        try:
            old.close()
        except Exception:  # the old server is gone; its sockets may already be closed
            log.debug("closing the old driver failed", exc_info=True)

    def readiness(self) -> dict[str, Any]:
        stuck = self.supervisor.stuck()
        writer = self.writer
        ready = self.db_up and not stuck and writer is not None
        return {"ready": ready, "neo4j": {"reachable": self.db_up, "uri": self.neo4j_uri, "error": self.db_error},
                "loops": self.supervisor.report(), "stuck_loops": stuck,
                "gmg_pending_writes": writer.pending if writer else 0,
                "gmg_dropped_writes": writer.rows_dropped if writer else 0,
                "unplaced_models": dict(self.unplaced)}

    def _health_metrics(self) -> Iterator[Metric]:
        failures = CounterMetricFamily("slicesched_loop_failures", "Failed ticks of a background loop", labels=["loop"])
        since = GaugeMetricFamily("slicesched_loop_last_ok_age_seconds",
                                  "Seconds since a background loop last ticked successfully", labels=["loop"])
        now = time.monotonic()
        for name, h in sorted(self.supervisor.loops.items()):
            failures.add_metric([name], h.failures)
            since.add_metric([name], now - (h.last_ok_at if h.last_ok_at is not None else h.started_at))
        yield failures
        yield since
        yield GaugeMetricFamily("slicesched_neo4j_up", "1 when Neo4j answers", value=1.0 if self.db_up else 0.0)
        writer = self.writer
        yield GaugeMetricFamily("slicesched_gmg_pending_writes", "GMG mirror rows waiting to be written",
                                value=writer.pending if writer else 0)
        yield CounterMetricFamily("slicesched_gmg_dropped_writes", "GMG mirror rows dropped past max_pending_writes",
                                  value=writer.rows_dropped if writer else 0)

    # ---- persistence -------------------------------------------------------------------------
    def persist(self, writes: Iterable[Write]) -> None:
        """Soft state for the GMG mirror, batched (see :mod:`service.api.writer`)."""
        assert self.writer is not None
        self.writer.submit(writes)

    async def accept_requests(self, reqs: list[LiveRequest]) -> list[LiveRequest]:
        """Write the requests to Neo4j (one transaction), then queue them: an answered request
        is never lost, and a failed write accepts none. Requests carrying an idempotency key
        their tenant used before are not created again: the earlier request is answered in
        their place (409 if it was submitted with a different body). A write that outlives
        its bound (503 to the client) still takes its requests in when it commits."""
        assert self.repo is not None
        keyed = [(r.tenant_id, r.idempotency_key) for r in reqs if r.idempotency_key]
        for k in keyed:  # a submission with the same key in flight: wait for it, then look again
            pending = self._submitting.get(k)
            if pending is not None:
                await asyncio.shield(pending)
        known = {k: self.state.by_idempotency.get(k) for k in keyed}
        answer: dict[str, LiveRequest] = {}
        fresh = []
        for req in reqs:
            old_id = known.get((req.tenant_id, req.idempotency_key)) if req.idempotency_key else None
            if old_id is not None:
                answer[req.request_id] = self._same_request(self.state.requests[old_id], req)
            else:
                fresh.append(req)
        if fresh:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            mine = [(r.tenant_id, r.idempotency_key) for r in fresh if r.idempotency_key]
            for k in mine:
                self._submitting[k] = done
            try:
                self._check_db()
                task = asyncio.ensure_future(asyncio.to_thread(self.repo.create_requests, [r.row() for r in fresh]))
                task.add_done_callback(lambda t: self._take_in(t, fresh))
                existing = await self._bounded(task, self.settings.call_timeout_s + 0.01 * len(fresh))
            finally:
                for k in mine:
                    self._submitting.pop(k, None)
                done.set_result(None)
            for req in fresh:
                if req.idempotency_key and req.idempotency_key in existing:  # known only to Neo4j (older)
                    answer[req.request_id] = self._same_request(self._stored(existing[req.idempotency_key]), req)
                else:
                    answer[req.request_id] = req
        return [answer[r.request_id] for r in reqs]

    def _take_in(self, task: asyncio.Future[Any], fresh: list[LiveRequest]) -> None:
        """Queue requests once their write committed (runs when the write ends, even after the
        client was answered 503: a committed request always runs, and once)."""
        if task.cancelled() or task.exception() is not None:
            return
        existing = task.result()
        taken = [r for r in fresh if not (r.idempotency_key and r.idempotency_key in existing)]
        for req in taken:
            self.state.accept(req)
            self.metrics.arrived(req)
        if taken:
            self.work.notify()
            self.changed.set()

    @staticmethod
    def _same_request(old: LiveRequest, new: LiveRequest) -> LiveRequest:
        if old.body_sha != new.body_sha:
            raise ConflictError(f"Idempotency-Key {new.idempotency_key!r} was used for a different request "
                                f"({old.request_id})")
        return old

    def _stored(self, row: dict[str, Any]) -> LiveRequest:
        """An earlier request known only to Neo4j (finished before the restart window), for the answer."""
        known = self.state.requests.get(str(row["uid"]))
        if known is not None:
            return known
        return LiveRequest(str(row["uid"]), "", "", [0] * int(row.get("prompt_tokens") or 0), 0, "",
                           int(row.get("token_budget") or 0), 0.0, status=RequestStatus(str(row.get("status"))),
                           idempotency_key=row.get("idempotency_key"), body_sha=row.get("body_sha"))

    async def complete(self, executor_id: str, completions: list[Completion]) -> tuple[list[str], list[dict[str, str]]]:
        """Completions of leases, durable before they are acknowledged: each accepted one's
        result, request state and done Slice are written in one transaction, then applied. A
        completion of a lease that is not live is rejected and changes nothing. When the write
        outlives its bound the executor gets a 503, and the outcome is applied when it lands."""
        assert self.repo is not None
        state = self.state
        rows: dict[str, dict[str, Any]] = {}
        rejected: list[dict[str, str]] = []
        for c in completions:
            try:
                rows[c.lease_id] = state.completion_row(executor_id, c)
            except (ConflictError, InvalidInputError) as exc:
                state.counters["completions_rejected"] += 1
                rejected.append({"lease_id": c.lease_id, "reason": str(exc)})
        if not rows:
            return [], rejected
        by_lease = {c.lease_id: c for c in completions}
        accepted: list[str] = []

        def settle(committed: set[str] | None, sent: bool = True) -> None:
            # committed None: the write failed; if it was sent, it may have committed all the same
            # (its answer lost): the request stays claimed until Neo4j says (see _reconcile).
            for lease_id, row in rows.items():
                req = state.requests[row["request"]["uid"]]
                if committed is not None and req.request_id in committed:
                    state.complete(by_lease[lease_id], row)
                    self.metrics.finished_request(req)
                    accepted.append(lease_id)
                elif committed is None and not sent:
                    state.abandon_finish(req)
                else:
                    self._unsettled.add(req.request_id)
                    if committed is not None:  # Neo4j holds it finished already: memory takes that state
                        state.counters["completions_rejected"] += 1
                        rejected.append({"lease_id": lease_id, "reason": f"request {req.request_id} is already finished"})
            if accepted:
                self.work.notify()
                self.changed.set()

        await self._group_commit(list(rows.values()), settle)
        return accepted, rejected

    async def _group_commit(self, rows: list[dict[str, Any]], settle: Any) -> None:
        """Completions from every executor that arrive while a commit is in flight are written
        together in the next one (group commit: one transaction for many batches, as a database
        log does), each settled with the shared outcome before its caller is answered."""
        try:
            self._check_db()
        except DatabaseUnavailableError:
            settle(None, False)
            raise
        done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._completion_batch.append((rows, settle, done))
        if self._completion_flush is None:
            self._completion_flush = asyncio.ensure_future(self._flush_completions())
        try:
            failure = await asyncio.wait_for(asyncio.shield(done), self.settings.call_timeout_s + 0.002 * len(rows))
        except TimeoutError:
            raise DatabaseUnavailableError("Neo4j did not answer in time; the completions will be settled when it "
                                           "does (retry them)", retry_after_s=self.settings.db_timeout_s) from None
        if failure is not None:
            if _neo4j_down(failure):
                raise DatabaseUnavailableError(f"Neo4j is unreachable: {type(failure).__name__}",
                                               retry_after_s=self.settings.db_timeout_s)
            raise failure

    async def _flush_completions(self) -> None:
        assert self.repo is not None
        try:
            while self._completion_batch:
                batch, self._completion_batch = self._completion_batch, []
                try:
                    committed: set[str] | None = await asyncio.to_thread(
                        self.repo.complete_leases, [row for rows, _, _ in batch for row in rows])
                    failure: BaseException | None = None
                except Exception as exc:
                    committed, failure = None, exc
                    if _neo4j_down(exc):
                        self._db_failed(f"{type(exc).__name__}: {exc}")
                for _, settle, done in batch:
                    try:
                        settle(committed)
                    except Exception:  # one batch's bookkeeping must not leave the others unsettled
                        log.exception("applying committed completions failed")
                    if not done.done():
                        done.set_result(failure)
        finally:
            self._completion_flush = None

    async def finish(self, req: LiveRequest, row: dict[str, Any], apply: Any) -> None:
        """Write a request's end without a result (``row`` for ``finish_requests``), then apply
        it in memory (``apply()`` returns the soft writes that follow)."""
        assert self.repo is not None
        outcome: list[bool] = []

        def settle(finished: set[str] | None) -> None:
            if finished is not None and req.request_id in finished:
                self.persist(apply())
                self.work.notify()
                self.changed.set()
                outcome.append(True)
            else:  # finished elsewhere, or a failed write that may have landed: Neo4j decides (_reconcile)
                self._unsettled.add(req.request_id)
                outcome.append(False)

        await self._write_then(self.repo.finish_requests, [row], settle)
        if not outcome[0]:
            raise ConflictError(f"request {req.request_id} is already finished")

    async def _write_then(self, fn: Any, rows: list[dict[str, Any]], settle: Any) -> None:
        """Run the write ``fn(rows)`` and ``settle`` its outcome exactly once: ``settle(result)``
        when it commits, ``settle(None)`` when it fails. Past the bound the caller gets a 503
        while the write runs on; its outcome is still settled when it ends."""
        try:
            self._check_db()
        except DatabaseUnavailableError:
            settle(None)
            raise
        settled: list[bool] = []

        def once(t: asyncio.Future[Any]) -> None:
            if settled:
                return
            settled.append(True)
            settle(t.result() if not t.cancelled() and t.exception() is None else None)

        task = asyncio.ensure_future(asyncio.to_thread(fn, rows))
        task.add_done_callback(once)
        try:
            await self._bounded(task, self.settings.call_timeout_s + 0.002 * len(rows))
        finally:
            if task.done():
                once(task)

    # ---- placement: homes --------------------------------------------------------------------
    @staticmethod
    def check_devices(devices: list[tuple[str, str, int]]) -> None:
        """Refuse, before anything is registered, devices that could never host a model:
        ``(name, kind, mem_bytes)`` each."""
        smallest = min(weight_bytes(MODEL_CONFIGS[f]) for f in LIVE_FAMILIES)
        small = [name for name, _, mem in devices if mem < smallest]
        if small:
            raise InvalidInputError(f"device(s) {', '.join(small)} have less memory than the smallest runnable "
                                    f"model's weights ({smallest} bytes): nothing was registered")

    async def replan(self) -> None:
        """(Re)compute home replicas after models or devices changed, and put the weights in the
        GMG. A model that fits nowhere is reported in :attr:`unplaced`, never fails the re-plan;
        when Neo4j cannot take the cluster's new shape now, the watcher writes it later."""
        async with self._replan_lock:
            self._replan()
            await self._write_cluster()

    def _replan(self) -> None:
        state = self.state
        devices = sorted(state.devices.values(), key=lambda d: d.device_id)
        models = sorted(state.models.values(), key=lambda m: m.uid)
        wanted = self._homes(models, devices) if devices and models else []
        current = {r.replica_id: r for r in state.replicas.values() if not r.guest and not r.pinned}
        keep = set()
        for uid, device_ids in wanted:
            rid = f"{uid}@{'+'.join(device_ids)}"
            keep.add(rid)
            if rid in current:
                current[rid].draining = False
            else:
                state.add_replica(uid, device_ids, guest=False)
        for rid, r in current.items():
            if rid not in keep:
                r.draining = True
        self._gmg_dirty = True
        self.work.notify()

    async def _write_cluster(self) -> None:
        """The live devices and where each model's weights reside, into the GMG."""
        assert self.repo is not None
        self._gmg_dirty = False
        devices = sorted(self.state.devices.values(), key=lambda d: d.device_id)
        spec = live_spec([(d.device_id, d.executor_id, d.kind, d.mem_bytes) for d in devices])
        on: dict[str, list[str]] = {uid: [] for uid in self.state.models}
        for r in self.state.replicas.values():
            on.setdefault(r.model_uid, []).extend(r.device_ids)
        try:
            if devices:
                await self.db(self.repo.apply_cluster, spec)
            for uid, device_ids in on.items():
                await self.db(self.repo.set_weight_residence, uid, sorted(set(device_ids)), cluster=LIVE_CLUSTER)
        except DatabaseUnavailableError:
            self._gmg_dirty = True  # the watcher writes it when Neo4j is back
            log.warning("the cluster's shape could not be written to the GMG now; it will be when Neo4j answers")

    def _homes(self, models: list[LiveModel], devices: list[Any]) -> list[tuple[str, tuple[str, ...]]]:
        """Home devices per model. A device too small for every model hosts none; a model whose
        weights fit no executor's devices is left out and reported; when whole-device homes are
        impossible, each model gets the device with the most room that holds it."""
        unplaced: dict[str, str] = {}
        smallest = min(m.weight_bytes for m in models)
        usable = [d for d in devices if d.mem_bytes >= smallest]
        per_executor: dict[str, int] = {}
        for d in usable:
            per_executor[d.executor_id] = per_executor.get(d.executor_id, 0) + d.mem_bytes
        room = max(per_executor.values(), default=0)
        fitting = []
        for m in models:
            if m.weight_bytes > room:
                unplaced[m.uid] = (f"its weights ({m.weight_bytes / 2**20:.1f} MiB) fit on no executor's devices "
                                   f"(largest: {room / 2**20:.1f} MiB)")
            else:
                fitting.append(m)
        out: list[tuple[str, tuple[str, ...]]] = []
        if fitting:
            try:
                out = self._container_homes(live_spec([(d.device_id, d.executor_id, d.kind, d.mem_bytes)
                                                       for d in usable]), fitting, usable)
            except InvalidInputError as exc:
                log.warning("whole-device homes impossible (%s): each model on the roomiest device that holds it", exc)
                out = self._greedy_homes(fitting, usable, unplaced)
        for uid, why in unplaced.items():
            if self.unplaced.get(uid) != why:
                log.warning("model %s has no home: %s", uid, why)
        self.unplaced = unplaced
        return out

    def _container_homes(self, spec: ClusterSpec, models: list[LiveModel],
                         devices: list[Any]) -> list[tuple[str, tuple[str, ...]]]:
        demands = [TenantDemand(m.uid, m.family, self.state.tenant(m.tenant_id).weight) for m in models]
        fits = min(len(models), len(devices))
        by_weight = sorted(demands, key=lambda t: (-t.device_s_per_s, t.tenant_id))
        placed = container_replicas(spec, by_weight[:fits], weight_bytes=lambda f: weight_bytes(MODEL_CONFIGS[f]),
                                    reserve_bytes=lambda f: 0)
        out = [(uid, devs) for uid, _, devs in placed]
        load: dict[str, int] = {d.device_id: 0 for d in devices}
        for _, devs in out:
            for d in devs:
                load[d] += 1
        for extra in by_weight[fits:]:  # more models than devices: share the least loaded one
            d = min(load, key=lambda x: (load[x], x))
            load[d] += 1
            out.append((extra.tenant_id, (d,)))
            log.warning("%s shares device %s: more models than devices", extra.tenant_id, d)
        return out

    @staticmethod
    def _greedy_homes(models: list[LiveModel], devices: list[Any],
                      unplaced: dict[str, str]) -> list[tuple[str, tuple[str, ...]]]:
        free = {d.device_id: d.mem_bytes for d in devices}
        out: list[tuple[str, tuple[str, ...]]] = []
        for m in sorted(models, key=lambda m: (-m.weight_bytes, m.uid)):
            best = max(free, key=lambda d: (free[d], d), default=None)
            if best is None or free[best] < m.weight_bytes:
                unplaced[m.uid] = f"no single device has room for its weights ({m.weight_bytes / 2**20:.1f} MiB)"
                continue
            free[best] -= m.weight_bytes
            out.append((m.uid, (best,)))
        return out

    # ---- placement: the scheduler loop ---------------------------------------------------------
    def snapshot(self, window_s: float = 20.0) -> LiveSnapshot:
        """The live state as the scheduler sees it. Compute units: an executor daemon runs one
        iteration at a time, so all its devices share one compute stream; the scheduler sees one
        device per executor (memory: its devices together) and a placement on it is put on the
        executor's device with the most free memory."""
        state = self.state
        now_wall = time.time()
        now = time.monotonic()
        family = {uid: m.family for uid, m in state.models.items()}
        unit_of = {d.device_id: d.executor_id for d in state.devices.values()}
        replicas = []
        first_home: dict[str, str] = {}
        for r in sorted(state.replicas.values(), key=lambda r: (r.guest, r.replica_id)):
            if not r.guest and not r.draining:
                first_home.setdefault(r.model_uid, r.replica_id)
        for r in state.replicas.values():
            waiting = state.waiting(r.model_uid) if first_home.get(r.model_uid) == r.replica_id else 0
            idle = 0.0 if r.leases else now - r.last_active
            units = tuple(dict.fromkeys(unit_of[d] for d in r.device_ids))
            replicas.append(ReplicaInfo(r.replica_id, r.model_uid, family[r.model_uid], units, waiting,
                                        len(r.leases), r.guest, r.draining, idle))
        devices, rows, devices_of = [], [], {}
        for e in state.executors.values():
            members = [state.devices[d] for d in e.device_ids if d in state.devices]
            if not members:
                continue
            devices_of[e.executor_id] = tuple(d.device_id for d in members)
            hosting = tuple(r.replica_id for r in state.replicas.values() if set(r.device_ids) & set(e.device_ids))
            devices.append(DeviceInfo(e.executor_id, e.executor_id, sum(state.free_bytes(d.device_id) for d in members),
                                      self._utilisation(e.executor_id), hosting))
            rows.append((e.executor_id, e.executor_id, members[0].kind, sum(d.mem_bytes for d in members)))
        start = now_wall - window_s
        recent = []
        for req in state.requests.values():
            if (req.status in TERMINAL and req.arrival < start) or req.status == RequestStatus.CANCELLED:
                continue
            recent.append(RequestSpec(req.request_id, req.model_uid, family[req.model_uid],
                                      max(0.0, req.arrival - start), len(req.prompt), req.token_budget,
                                      req.sla_class))
        return LiveSnapshot(now - self.started, live_spec(rows), tuple(replicas), tuple(devices),
                            {r.replica_id: r.max_batch for r in state.replicas.values()}, tuple(recent), window_s,
                            dict(state.iteration_s), devices_of)

    def _utilisation(self, executor_id: str) -> float:
        e = self.state.executors[executor_id]
        now = time.monotonic()
        t0, b0 = self._busy_mark.get(executor_id, (self.started, 0.0))
        return min(1.0, (e.busy_s - b0) / (now - t0) / max(1, len(e.device_ids))) if now > t0 else 0.0

    def _cypher_candidates(self, view: LiveClusterView, tenant: str, k: int) -> list[tuple[str, ...]]:
        """Candidate units from the Cypher candidate-slot search over the live devices in the GMG:
        the query runs on real devices; each answer counts for its executor (compute unit)."""
        assert self.repo is not None
        repo = self.repo
        devices_of = view.snap.devices_of
        unit_of = {d: u for u, ds in devices_of.items() for d in ds}

        def search(q: SlotQuery) -> list[Slot]:
            deps = tuple(InputDep(devices_of[d.device_id][0] if d.device_id in devices_of else d.device_id,
                                  d.end_s, d.bytes) for d in q.input_deps)
            slots = repo.find_candidate_slots(replace(q, input_deps=deps, k=max(q.k, len(unit_of))))
            best: dict[str, Slot] = {}
            for slot in slots:  # best first
                unit = unit_of.get(slot.device_id)
                if unit is not None and unit not in best:
                    best[unit] = replace(slot, device_id=unit)
            return list(best.values())[: q.k]

        return candidate_groups(view, tenant, k, search=search)

    async def _schedule_tick(self) -> None:
        """Wait (up to a few seconds) for arrivals or completions, then step the slice policy."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), 5.0)
        if not self.changed.is_set():
            return
        self.changed.clear()
        if self.settings.placement == "slice" and self.state.replicas:
            await self.step()

    async def step(self) -> Decision:
        """One ``Scheduler.step`` on a snapshot (in a worker thread), then apply its decision."""
        snap = self.snapshot()
        for eid, e in self.state.executors.items():
            self._busy_mark[eid] = (time.monotonic(), e.busy_s)
        started = time.perf_counter()
        view = LiveClusterView(snap, cost_model=self.cost_model)
        decision = await asyncio.to_thread(lambda: self.scheduler.step(snap.now_s, view))
        self.step_s.append(time.perf_counter() - started)
        return await self.apply(decision)

    async def apply(self, decision: Decision) -> Decision:
        state = self.state
        for rid in decision.drain:
            if rid in state.replicas:
                state.replicas[rid].draining = True
        for change in decision.add:  # device ids are compute units (executors): pick their roomiest device
            real = []
            for unit in change.device_ids:
                members = [d for d in state.devices.values() if d.executor_id == unit]
                if members:
                    real.append(max(members, key=lambda d: (state.free_bytes(d.device_id), d.device_id)).device_id)
            if change.tenant_id in state.models and len(real) == len(change.device_ids):
                state.add_replica(change.tenant_id, tuple(real), guest=True)
        for note in decision.notes:
            log.info("scheduler: %s", note)
            self.decisions.append(note)
        if decision.add or decision.drain:
            self.work.notify()
            await self._write_cluster()
        return decision

    async def _expiry_tick(self) -> None:
        executors = len(self.state.executors)
        writes = self.state.expire()
        removed = self.state.remove_drained()
        if writes:
            self.persist(writes)
            self.work.notify()
        if len(self.state.executors) != executors:  # a silent executor was dropped: new homes
            log.warning("executor(s) silent for %.0fs dropped; re-planning homes", 3 * self.settings.lease_ttl_s)
            await self.replan()
        elif removed:
            await self._write_cluster()
        if writes or removed:
            self.changed.set()

    def policy_what_if(self, horizon_s: float) -> dict[str, Any]:
        """What one step of the slice policy would decide on the current state (nothing applied)."""
        from service.core.placement import SlicePlacementPolicy

        policy = SlicePlacementPolicy(horizon_s=horizon_s, find_devices=self._cypher_candidates)  # type: ignore[arg-type]
        snap = self.snapshot()
        decision = policy.step(snap.now_s, LiveClusterView(snap, cost_model=self.cost_model))
        return {"placement": "slice", "horizon_s": horizon_s, "whatifs": decision.num_whatifs,
                "add": [{"model": c.tenant_id, "compute_units": list(c.device_ids)} for c in decision.add],
                "drain": decision.drain, "notes": decision.notes}

    async def _retention_tick(self) -> None:
        """Bounded retention: live Slices older than ``slice_retention_s`` go (every 10 minutes)."""
        assert self.repo is not None
        deleted = await self.db(self.repo.delete_old_live_slices, time.time() - self.settings.slice_retention_s)
        if deleted:
            log.info("retention: deleted %d live slices", deleted)

    # ---- what-if (admin) -------------------------------------------------------------------------
    def what_if(self, model_uid: str, device_ids: tuple[str, ...], horizon_s: float) -> dict[str, Any]:
        from service.core.scheduler import ReplicaChange

        if model_uid not in self.state.models:
            raise InvalidInputError(f"no model {model_uid!r}")
        unknown = [d for d in device_ids if d not in self.state.devices]
        if unknown or not device_ids:
            raise InvalidInputError(f"unknown devices {unknown or 'none given'}")
        units = tuple(dict.fromkeys(self.state.devices[d].executor_id for d in device_ids))
        view = LiveClusterView(self.snapshot(), cost_model=self.cost_model)
        baseline, changed = view.what_if(ReplicaChange(model_uid, self.state.models[model_uid].family, units),
                                         horizon_s)

        def plain(o: Any) -> dict[str, Any] | None:
            return None if o is None else {"output_tokens": o.output_tokens, "violations_by_model": o.violations_by_tenant,
                                           "memory_violations": o.memory_violations, "peak_bytes": o.peak_bytes}

        return {"horizon_s": horizon_s, "compute_units": list(units), "baseline": plain(baseline),
                "with_change": plain(changed), "feasible": changed is not None}

