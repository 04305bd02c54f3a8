"""Durable request intake and ends: requests written before they are answered, completions
group-committed (result, request and done Slice in one transaction) before they are applied,
and writes whose outcome was lost reconciled against Neo4j."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from service.domain.error import ConflictError, DatabaseUnavailableError, InvalidInputError
from service.domain.request import RequestStatus
from service.domain.wire import Completion
from service.graph.repository import GraphRepository
from service.live.access import AccessBook
from service.live.metrics import LiveMetrics
from service.live.neo4j_gate import Neo4jGate, neo4j_down
from service.live.notify import Signal
from service.live.quota import QuotaBook
from service.live.records import TERMINAL, LiveRequest, Write
from service.live.state import LiveState

log = logging.getLogger("slicesched.service")


class DurableWrites:
    """Writes that must land before an answer: submissions, completions and request ends
    (a part of :class:`~service.live.service.LiveService`, its parts passed in)."""

    def __init__(self, gate: Neo4jGate, state: LiveState, metrics: LiveMetrics, work: Signal,
                 changed: asyncio.Event, persist: Callable[[Iterable[Write]], None], access: AccessBook,
                 quotas: QuotaBook) -> None:
        self.gate, self.state, self.metrics = gate, state, metrics
        self.settings = gate.settings  # call_timeout_s, db_timeout_s
        self.work = work  # notified when leases may be granted
        self.changed = changed  # set on arrivals and completions (the scheduler's trigger)
        self.persist = persist  # soft writes for the GMG mirror
        self.access = access  # projects and tenant quotas
        self.quotas = quotas  # usage against them
        self._submitting: dict[tuple[str, str], asyncio.Future[None]] = {}  # idempotency keys in flight
        self.unsettled: set[str] = set()  # requests whose end's write has no clear outcome yet
        self._completion_batch: list[tuple[list[dict[str, Any]], Any, asyncio.Future[BaseException | None]]] = []
        self._completion_flush: asyncio.Future[None] | None = None  # the group commit in flight

    @property
    def repo(self) -> GraphRepository | None:
        return self.gate.repo

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
                self.gate.check()
                self.admit(fresh)  # quotas: a 429 accepts none
                task = self.gate.in_thread(self.repo.live.create_requests, [r.row() for r in fresh])
                task.add_done_callback(lambda t: self._settle_intake(t, fresh))
                existing = await self.gate.bounded(task, self.settings.call_timeout_s + 0.01 * len(fresh))
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

    def _settle_intake(self, task: asyncio.Future[Any], fresh: list[LiveRequest]) -> None:
        """Queue requests once their write committed (runs when the write ends, even after the
        client was answered 503: a committed request always runs, and once); what was charged
        to quotas for requests not created (a failed write, an earlier idempotent request) is
        given back."""
        if task.cancelled() or task.exception() is not None:
            self.refund(fresh)
            return
        existing = task.result()
        taken = [r for r in fresh if not (r.idempotency_key and r.idempotency_key in existing)]
        self.refund([r for r in fresh if r.idempotency_key and r.idempotency_key in existing])
        for req in taken:
            self.state.accept(req)
            self.metrics.arrived(req)
        if taken:  # the executors that can lease them, about as many as there are requests
            models = {r.model_uid for r in taken}
            self.work.notify(*self.state.takers(models, len(taken)))
            self.changed.set()

    def admit(self, reqs: list[LiveRequest]) -> None:
        """Charge the requests to their tenants' and projects' quotas, all or none (a 429 with
        ``Retry-After`` for work beyond one)."""
        now = self.state.wall()
        by_scope: dict[tuple[str, str], int] = {}
        for r in reqs:
            by_scope[(r.tenant_id, r.project_id)] = by_scope.get((r.tenant_id, r.project_id), 0) + \
                len(r.prompt) + r.max_tokens
        charged: list[tuple[str, str, int]] = []
        try:
            for (tenant_id, project_id), tokens in by_scope.items():
                project = self.access.project(tenant_id, project_id)
                self.quotas.admit([(tenant_id, None, self.access.quota_of(tenant_id)),
                                   (tenant_id, project_id, project.quota)], tokens, now)
                charged.append((tenant_id, project_id, tokens))
        except BaseException:
            for tenant_id, project_id, tokens in charged:
                self.quotas.refund(tenant_id, project_id, tokens, now)
            raise

    def refund(self, reqs: list[LiveRequest]) -> None:
        """Give back what :meth:`admit` charged (the requests were not accepted after all)."""
        now = self.state.wall()
        for r in reqs:
            self.quotas.refund(r.tenant_id, r.project_id, len(r.prompt) + r.max_tokens, now)

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
        observed: list[Write] = []

        def settle(committed: set[str] | None, sent: bool = True) -> None:
            # committed None: the write failed; if it was sent, it may have committed all the same
            # (its answer lost): the request stays claimed until Neo4j says (see reconcile).
            for lease_id, row in rows.items():
                req = state.requests[row["request"]["uid"]]
                if committed is not None and req.request_id in committed:
                    observed.extend(state.complete(by_lease[lease_id], row))
                    self.metrics.request_ended(req)
                    accepted.append(lease_id)
                elif committed is None and not sent:
                    state.abandon_finish(req)
                else:
                    self.unsettled.add(req.request_id)
                    if committed is not None:  # Neo4j holds it finished already: memory takes that state
                        state.counters["completions_rejected"] += 1
                        rejected.append({"lease_id": lease_id, "reason": f"request {req.request_id} is already finished"})
            if observed:
                self.persist(observed)  # what the executor measured: soft state, batched
            if accepted:  # a batch slot free on each: the executors that can fill them from a queue
                models = {state.requests[rows[lease_id]["request"]["uid"]].model_uid for lease_id in accepted}
                waiting = [m for m in models if state.queues.get(m)]
                if waiting:
                    self.work.notify(*state.takers(waiting, len(accepted)))
                self.changed.set()

        await self._group_commit(list(rows.values()), settle)
        return accepted, rejected

    async def _group_commit(self, rows: list[dict[str, Any]], settle: Any) -> None:
        """Completions from every executor that arrive while a commit is in flight are written
        together in the next one (group commit: one transaction for many batches, as a database
        log does), each settled with the shared outcome before its caller is answered."""
        try:
            self.gate.check()
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
            if neo4j_down(failure):
                raise DatabaseUnavailableError(f"Neo4j is unreachable: {type(failure).__name__}",
                                               retry_after_s=self.settings.db_timeout_s)
            raise failure

    async def _flush_completions(self) -> None:
        assert self.repo is not None
        try:
            while self._completion_batch:
                batch, self._completion_batch = self._completion_batch, []
                try:
                    committed: set[str] | None = await self.gate.in_thread(
                        self.repo.live.complete_leases, [row for rows, _, _ in batch for row in rows])
                    failure: BaseException | None = None
                except Exception as exc:
                    committed, failure = None, exc
                    if neo4j_down(exc):
                        self.gate.failed(f"{type(exc).__name__}: {exc}")
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
                self.metrics.request_ended(req)
                self.work.notify()
                self.changed.set()
                outcome.append(True)
            else:  # finished elsewhere, or a failed write that may have landed: Neo4j decides (reconcile)
                self.unsettled.add(req.request_id)
                outcome.append(False)

        await self._write_then(self.repo.live.finish_requests, [row], settle)
        if not outcome[0]:
            raise ConflictError(f"request {req.request_id} is already finished")

    async def _write_then(self, fn: Any, rows: list[dict[str, Any]], settle: Any) -> None:
        """Run the write ``fn(rows)`` and ``settle`` its outcome exactly once: ``settle(result)``
        when it commits, ``settle(None)`` when it fails. Past the bound the caller gets a 503
        while the write runs on; its outcome is still settled when it ends."""
        try:
            self.gate.check()
        except DatabaseUnavailableError:
            settle(None)
            raise
        settled: list[bool] = []

        def once(t: asyncio.Future[Any]) -> None:
            if settled:
                return
            settled.append(True)
            settle(t.result() if not t.cancelled() and t.exception() is None else None)

        task = self.gate.in_thread(fn, rows)
        task.add_done_callback(once)
        try:
            await self.gate.bounded(task, self.settings.call_timeout_s + 0.002 * len(rows))
        finally:
            if task.done():
                once(task)

    async def reconcile(self) -> None:
        """Requests whose end was written without a clear answer: adopt what Neo4j holds (done,
        cancelled or failed: memory follows, nothing runs them again), else release the claim."""
        assert self.repo is not None
        repo = self.repo
        uids = sorted(self.unsettled)
        stored: dict[str, dict[str, Any]] = await self.gate.watch_call(lambda: repo.live.request_results(uids))
        for uid in uids:
            self.unsettled.discard(uid)
            req = self.state.requests.get(uid)
            if req is None or req.status in TERMINAL:
                continue
            row = stored.get(uid)
            if row is not None and row["status"] in TERMINAL:
                log.warning("request %s is %s in Neo4j: memory follows", uid, row["status"])
                self.persist(self.state.adopt(req, row))
                self.metrics.request_ended(req)
            else:
                self.state.abandon_finish(req)
        self.work.notify()
        self.changed.set()
