"""The live service: state, persistence and the scheduler loop behind the HTTP API.

:class:`LiveService` owns the Neo4j driver, the :class:`~service.live.state.LiveState` mirror,
the batched :class:`~service.live.writer.GmgWriter` and the supervised background loops: lease
expiry, the scheduler (the same ``Scheduler.step`` as replay, run on arrivals and completions at
most every ``schedule_interval_s``, in a worker thread on a snapshot), the GMG writer, retention
and the Neo4j watcher. At start it rebuilds its state from Neo4j: tenants (with key hashes),
models, and every request that was accepted and not finished, queued again (leases of the
previous process are void); then the workflows, the running ones resumed
(:meth:`~service.live.workflows.WorkflowBook.restore`).

It is composed of objects, one module each, their parts passed in through their constructors:
the Neo4j gate (:class:`~service.live.neo4j_gate.Neo4jGate`), durable intake and completions
(:class:`~service.live.durable.DurableWrites`), the placement loop with the what-ifs
(:class:`~service.live.scheduling.SchedulingLoop`), home replicas
(:class:`~service.live.homes.HomePlanner`), key administration
(:class:`~service.live.key_admin.KeyAdmin`), leader election
(:class:`~service.live.leader.Leadership`), the read side (:class:`~service.live.reads.LiveReads`)
and the books (access, quotas, onboarding, workflows, streams). This module holds the
lifecycle, the restart recovery and the background loops' ticks.

Placement: ``container`` gives each served model whole devices in proportion to its tenant's
weight (the same allocation as replay; when there are more models than devices, the extra ones
share the least loaded device). ``slice`` starts from the same homes and adds guest replicas
where the what-if simulator says it pays, found by the Cypher candidate-slot search on the GMG.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from learned.artifact import LoadedCostModel, default_cache_dir, default_inputs, load_cost_model
from learned.observations import load_observed, train_observed
from service.core.queue import QueuedRequest, QueuePolicy, make_queue_policy
from service.domain.audit import SYSTEM
from service.domain.error import InvalidInputError, InvariantError, NotLeaderError, UnauthorizedError
from service.domain.principal import Principal
from service.domain.quota import Quota
from service.domain.request import RequestStatus
from service.domain.role import ADMIN, EXECUTOR, TENANT_ADMIN
from service.domain.wire import Completion
from service.graph.repository import GraphRepository
from service.live import threads
from service.live.access import DEFAULT_PROJECT, AccessBook, ApiKeyRecord, LiveProject
from service.live.audit import AuditLog
from service.live.call_health import CallHealth
from service.live.credential import hash_key
from service.live.durable import DurableWrites
from service.live.governance import Governance
from service.live.homes import HomePlanner
from service.live.intake import Intake
from service.live.key_admin import KeyAdmin
from service.live.keys import ExecutorPools
from service.live.leader import Leadership
from service.live.leasing import Leasing
from service.live.metrics import PREFIX, LiveMetrics
from service.live.neo4j_gate import Neo4jGate, retrieve
from service.live.notify import Signal
from service.live.onboarding import AccessRequests
from service.live.predictors import LivePredictors, PredictorSettings
from service.live.quota import QuotaBook
from service.live.reads import LiveReads
from service.live.records import TERMINAL, LiveModel, LiveRequest, Write
from service.live.registration import Registration, model_from_dir
from service.live.retention import Retention
from service.live.retraining import CostModelRetrainer, Swap, trace_observed
from service.live.scheduling import SchedulingLoop
from service.live.settings import ServiceSettings
from service.live.state import LiveState
from service.live.streams import StreamBook
from service.live.supervisor import Supervisor
from service.live.workflows import WorkflowBook
from service.live.writer import GmgWriter

log = logging.getLogger("slicesched.service")

RECOVER_FINISHED_S = 24 * 3600.0  # finished requests loaded at start (for status queries)


class LiveService:
    """The service layer behind the routers (see the module docstring): one facade over the
    objects it is composed of."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        loaded = load_cost_model(settings.cost_model)
        self.cost_model = loaded.model  # the what-if mirror's; never a fallback
        self.cost_model_sha256 = loaded.sha256  # the artifact pricing the decisions now (a retrain swaps both)
        self.started = time.monotonic()
        # the distributional predictor and the observations of finished workflow steps
        self.predictors = LivePredictors(PredictorSettings(settings.predictor, settings.predictor_refit_s,
                                                           settings.predictor_min_new, settings.predictor_window,
                                                           settings.predictor_seed), settings.observations_path)
        self.state = LiveState(self.queue_policy(settings.queue, {}), clock=time.monotonic, wall=time.time,
                               lease_ttl_s=settings.lease_ttl_s, max_attempts=settings.max_attempts,
                               max_batch=settings.max_batch)
        self.metrics = LiveMetrics(self.state)
        self.gate = Neo4jGate(settings)  # the driver, the repository, every call bounded
        self.reads = LiveReads(self.state, self, inspect_timeout_s=settings.inspect_timeout_s,
                               max_inspections=settings.max_inspections,
                               inspect_max_rows=settings.inspect_max_rows)  # what the HTTP layer reads
        self.streams = StreamBook()  # tokens on their way to waiting clients (the OpenAI endpoints)
        self.access = AccessBook()  # people's and services' keys, projects, tenant quotas
        self.quotas = QuotaBook()  # usage against them
        self.access_requests = AccessRequests()  # onboarding and later changes, awaiting approval
        self.state.book.on_end = self._request_ended
        self.state.book.on_lease_end = self._lease_ended
        self.state.book.on_extend = self.persist  # renewals past a lease's expected end: its busy window
        self.pools = ExecutorPools(settings.executor_key, settings.executor_kinds)  # executor keys
        self.writer: GmgWriter | None = None
        self.audit = AuditLog(enabled=settings.audit, wait_s=settings.call_timeout_s)  # its store: at start
        self.key_admin = KeyAdmin(self.gate, self.pools, self.state, self.audit, self.persist, self.replan)
        self.supervisor = Supervisor()
        self.retention: Retention | None = None  # archive-then-delete of what grows (needs the store: at start)
        self.metrics.watch(self._health_metrics)
        self.metrics.watch(self._quota_metrics)
        self.metrics.watch(lambda: self.predictors.metrics(PREFIX))
        self.work = Signal()  # notified when leases may be granted
        self.changed = asyncio.Event()  # set on arrivals and completions (the scheduler's trigger)
        self.homes = HomePlanner(self.state, self.metrics, self.audit, self.work, self.db, lambda: self.repo)
        self.durable = DurableWrites(self.gate, self.state, self.metrics, self.work, self.changed, self.persist,
                                     self.access, self.quotas)  # submissions, completions, request ends
        self.loop = SchedulingLoop(settings.placement, self.gate, self.state, self.metrics, self.audit, self.homes,
                                   self.work, self.changed, lambda: self.cost_model,
                                   headroom_utilisation=settings.headroom_utilisation,
                                   confirm_drains=settings.confirm_drains)  # placement steps, what-ifs
        self.registration = Registration(self.gate, self.state, self.pools, self.access, self.audit, self.metrics,
                                         self.persist, self.replan, self.check_devices,
                                         settings.max_batch)  # tenants, models, executors, pinned replicas
        self.governance = Governance(self.gate, self.state, self.access, self.access_requests, self.audit,
                                     self.registration, settings.max_pending_access_requests)  # keys, projects, quotas
        self.intake = Intake(self.state, self.access, self.finish, settings.max_queued)  # requests built, cancelled
        self.workflows = WorkflowBook(self.gate, self.state, self.audit, self.predictors, self.intake,
                                      self.accept_requests, self.persist,
                                      tool_slots=os.cpu_count() or 1)  # DAGs of model and tool calls
        self.leasing = Leasing(self.state, self.streams, self.work, self.persist, self.finish,
                               settings.lease_ttl_s)  # the executors' long poll, progress, failures
        self.leadership: Leadership | None = None  # leader election on: this process's run (at start)
        self._campaign: asyncio.Task[None] | None = None
        # the leadership's asks run on a thread of their own: on the shared pool (six threads on two
        # cores) they queued behind calls waiting out a Neo4j outage, and the leader, back late, lost
        # its term to the standby (found in the chaos-slice run)
        self._leader_thread: ThreadPoolExecutor | None = None
        self._stepped_down = False  # on_fatal called for a deposed leader
        self.on_fatal: Callable[[str], None] = lambda why: end_process(why)  # a deposed leader, a failed take-over
        self.taking_traffic = False  # started (with leader election: won, recovered and started)

    # ---- the Neo4j side (service.live.neo4j_gate) ------------------------------------------------
    @property
    def repo(self) -> GraphRepository | None:
        """The GMG's repository (None before start)."""
        return self.gate.repo

    @property
    def db_up(self) -> bool:
        return self.gate.db_up

    @property
    def neo4j_uri(self) -> str | None:
        return self.gate.neo4j_uri

    @property
    def calls(self) -> CallHealth:
        return self.gate.calls

    async def db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A repository call, bounded and failing fast while Neo4j is down (:meth:`Neo4jGate.db`)."""
        return await self.gate.db(fn, *args, **kwargs)

    def in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """``fn`` in a worker thread the stop waits for (:meth:`Neo4jGate.in_thread`)."""
        return self.gate.in_thread(fn, *args, **kwargs)

    def persist(self, writes: Iterable[Write]) -> None:
        """Soft state for the GMG mirror, batched (see :mod:`service.live.writer`)."""
        assert self.writer is not None
        self.writer.submit(writes)

    # ---- durable writes (service.live.durable) and the placement loop (service.live.scheduling) ----
    async def accept_requests(self, reqs: list[LiveRequest]) -> list[LiveRequest]:
        """Write the requests, then queue them (:meth:`DurableWrites.accept_requests`)."""
        return await self.durable.accept_requests(reqs)

    async def complete(self, executor_id: str, completions: list[Completion]) -> tuple[list[str], list[dict[str, str]]]:
        """Completions of leases, durable before they are acknowledged (:meth:`DurableWrites.complete`)."""
        return await self.durable.complete(executor_id, completions)

    async def finish(self, req: LiveRequest, row: dict[str, Any], apply: Any) -> None:
        """A request's end without a result, written then applied (:meth:`DurableWrites.finish`)."""
        await self.durable.finish(req, row, apply)

    def what_if(self, model_uid: str, device_ids: tuple[str, ...], horizon_s: float) -> dict[str, Any]:
        """What a replica of ``model_uid`` on ``device_ids`` would do (:meth:`SchedulingLoop.what_if`)."""
        return self.loop.what_if(model_uid, device_ids, horizon_s)

    def policy_what_if(self, horizon_s: float) -> dict[str, Any]:
        """What one step of the replica policy would decide (:meth:`SchedulingLoop.policy_what_if`)."""
        return self.loop.policy_what_if(horizon_s)

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Open Neo4j, then take traffic; with leader election on, run for the leadership in the
        background and take traffic once won (until then every call but the probes answers 503
        ``not_leader``; :mod:`service.live.leader`)."""
        await self.predictors.start()  # a predictor that cannot be loaded stops the start, with its reason
        repo = await asyncio.to_thread(self.gate.open)
        await asyncio.to_thread(repo.apply_schema)
        if self.settings.leader_election:
            self.leadership = Leadership(repo.live, ttl_s=self.settings.leader_ttl_s)
            self._leader_thread = ThreadPoolExecutor(1, thread_name_prefix="leadership")
            self._campaign = asyncio.create_task(self._run_for_leadership(), name="leader-election")
            self._campaign.add_done_callback(self._campaign_ended)
            return
        await self._take_traffic()

    async def _run_for_leadership(self) -> None:
        """Ask for the leadership every fifth of a term until won, then recover and take traffic
        as a restarted service does, the repository's writes fenced by the term."""
        lead, repo = self.leadership, self.repo
        assert lead is not None and repo is not None
        said = 0.0
        while True:
            try:
                if await threads.run(lead.contend, executor=self._leader_thread):
                    break
                seen = lead.last
                if time.monotonic() - said > 60.0:  # a standby says so once a minute, not every ask
                    said = time.monotonic()
                    log.info("standing by: %s leads at epoch %s", seen and seen.holder, seen and seen.epoch)
            except Exception as exc:  # Neo4j unreachable: keep asking, following a managed server that moved
                if time.monotonic() - said > 60.0:
                    said = time.monotonic()
                    log.warning("cannot ask for the leadership (%s: %s); asking again", type(exc).__name__, exc)
                await self._follow_neo4j()
            await asyncio.sleep(lead.interval_s)
        repo.fence = lead
        # renewals from now on: a take-over (the recovery) may take longer than a term
        # a failed renewal is asked again at the renewal interval, not after the supervisor's
        # back-off: a leader back from an outage renews before the standby's grace ends
        self.supervisor.spawn("leadership", self._leadership_tick, interval_s=lead.interval_s,
                              backoff_s=lead.interval_s, stuck_after_s=max(30.0, 3 * lead.ttl_s))
        await self._take_traffic()

    async def _follow_neo4j(self) -> None:
        """A standby's failed ask: reconnect if the managed Neo4j restarted on another port. Only
        the leader's watcher (:meth:`_neo4j_tick`) followed it before; a standby kept asking the
        old port, so a leader killed after a move left no leader (found in the chaos-slice run).
        Errors here are the next ask's to report."""
        try:
            await self.gate.reachable()
        except Exception:
            log.debug("following the managed Neo4j failed; the next ask tries again", exc_info=True)

    def _campaign_ended(self, task: asyncio.Task[None]) -> None:
        """The run for the leadership never ends silently: a failed take-over ends the process
        (as a failed start does), so that whatever runs it starts it again."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("taking over as leader failed; stopping", exc_info=exc)
            self.on_fatal(f"taking over as leader failed: {type(exc).__name__}: {exc}")

    async def _leadership_tick(self) -> None:
        """Renew the term; a leader found deposed stops (``on_fatal``): it may write nothing more
        (its fence refuses) and whatever runs it starts it again as a standby."""
        lead = self.leadership
        assert lead is not None
        try:
            await threads.run(lead.contend, executor=self._leader_thread)
        except Exception as exc:
            if not lead.leads:
                raise NotLeaderError(f"leadership not renewed ({type(exc).__name__}: {exc}); writes stopped "
                                     "until it is") from exc
        if lead.deposed and not self._stepped_down:  # once: a second SIGTERM would force uvicorn's exit
            self._stepped_down = True
            seen = lead.last
            self.on_fatal(f"deposed: {seen and seen.holder} leads at epoch {seen and seen.epoch}")

    async def _take_traffic(self) -> None:
        """Recover the state from the GMG and start the loops (the Neo4j side is open)."""
        if self.repo is None:
            raise InvariantError("taking traffic before Neo4j is open")
        await self._recover()
        self.pools.recover(await asyncio.to_thread(self.repo.live.live_executor_pools))
        self.writer = GmgWriter(self.repo, on_lag=self.metrics.write_lag.observe,
                                max_pending=self.settings.max_pending_writes)
        await asyncio.to_thread(self.writer.warm_up)
        self.audit.repo = self.repo.audit
        sup = self.supervisor
        if self.audit.enabled:
            await asyncio.to_thread(self.audit.recover)
            sup.spawn("audit-writer", self.audit.tick, interval_s=0.0, stuck_after_s=60.0)
            self.audit.record(SYSTEM, "service.start", "service", details={"audit_head_seq": self.audit.head[0]},
                              after=self._public_settings())
        sup.spawn("lease-expiry", self._expiry_tick, interval_s=min(0.5, self.settings.lease_ttl_s / 4),
                  stuck_after_s=30.0)
        sup.spawn("scheduler", self.loop.tick, interval_s=self.settings.schedule_interval_s,
                  stuck_after_s=300.0)
        sup.spawn("gmg-writer", self.writer.tick, interval_s=0.0, stuck_after_s=60.0)
        settings = self.settings
        self.retention = Retention(self.repo, settings.retention, observations=settings.observations_path)
        sup.spawn("retention", self._retention_tick, interval_s=settings.retention.interval_s,
                  stuck_after_s=max(1800.0, 3 * settings.retention.interval_s))
        sup.spawn("neo4j-watch", self._neo4j_tick, interval_s=1.0, stuck_after_s=60.0)
        sup.spawn("usage", self._usage_tick, interval_s=self.settings.usage_interval_s, stuck_after_s=120.0)
        sup.spawn("observations", self.predictors.flush, interval_s=1.0, stuck_after_s=120.0)
        if self.settings.cost_model_retrain_s > 0:
            retrain_s = self.settings.cost_model_retrain_s
            sup.spawn("cost-model-retrain", self._retrainer().tick, interval_s=retrain_s,
                      stuck_after_s=max(3 * retrain_s, 3600.0))
        if self.predictors.enabled:
            refit_s = self.settings.predictor_refit_s
            sup.spawn("predictor-refit", self.predictors.refit_tick, interval_s=refit_s,
                      stuck_after_s=max(3 * refit_s, 600.0))
        # workflows last: a resumed model call asks for its request again (recovered above)
        await self.workflows.restore(await asyncio.to_thread(self.repo.workflows.live_workflows, time.time() - RECOVER_FINISHED_S))
        self.taking_traffic = True

    def _retrainer(self) -> CostModelRetrainer:
        """The scheduled retrain of the what-if's cost model (:mod:`service.live.retraining`)."""
        cache_dir = default_cache_dir()

        def read(since_wall: float) -> list[dict[str, Any]]:
            assert self.repo is not None  # the current one (a Neo4j restart replaces it)
            return self.repo.live.slice_observations(since_wall)

        def swap(loaded: LoadedCostModel, record: Swap) -> None:
            before = self.cost_model_sha256
            self.cost_model, self.cost_model_sha256 = loaded.model, loaded.sha256
            self.audit.record(SYSTEM, "cost_model.swapped", "cost_model", before={"sha256": before},
                              after={"sha256": loaded.sha256, "artifact": record.artifact},
                              details={"observations": record.observations})

        return CostModelRetrainer(
            read=read, load=load_observed, swap=swap, files_dir=cache_dir,
            train=lambda path: train_observed(path, default_inputs(), cache_dir, trace_observed),
            min_new=self.settings.cost_model_retrain_min_new)

    async def stop(self) -> None:
        campaign = self._campaign
        if campaign is not None and not campaign.done():
            campaign.cancel()
        await self.workflows.stop()
        await self.supervisor.stop()
        await self.gate.stop_reopening()
        await asyncio.to_thread(self.gate.close_retired, older_than_s=0.0)
        try:
            await self.predictors.flush()  # the last observations
        except Exception:
            log.exception("observations not written at stop")
        if self.writer is not None:
            await self.writer.close()
        if self.repo is not None:
            await self.audit.close()
        await threads.drain(30.0)  # a scheduler step or a call cancelled on its way still holds a session
        lead = self.leadership
        if lead is not None and lead.leads:  # the standby takes over at its next ask, not at the term's end
            try:
                await threads.run(lead.release, executor=self._leader_thread)
            except Exception:
                log.warning("the leadership was not released at stop; the standby takes over when its term ends",
                            exc_info=True)
        if self._leader_thread is not None:
            self._leader_thread.shutdown(wait=False)
        if self.gate.driver is not None:
            await asyncio.to_thread(self.gate.driver.close)

    # ---- readiness and health --------------------------------------------------------------------
    def readiness(self) -> dict[str, Any]:
        stuck = self.supervisor.stuck()
        writer = self.writer
        gate = self.gate
        ready = gate.db_up and not stuck and writer is not None and not gate.calls.failing()
        lead = self.leadership
        if lead is not None:
            ready = ready and lead.leads and self.taking_traffic
        return {"ready": ready, "neo4j": {"reachable": gate.db_up, "uri": gate.neo4j_uri, "error": gate.db_error},
                "leadership": None if lead is None else lead.describe(),
                "lease_path": gate.calls.report(),
                "loops": self.supervisor.report(), "stuck_loops": stuck,
                "gmg_pending_writes": writer.pending if writer else 0,
                "gmg_dropped_writes": writer.rows_dropped if writer else 0,
                "unplaced_models": dict(self.homes.unplaced), "audit": self.audit.report()}

    def _health_metrics(self) -> Iterator[Metric]:
        failures = CounterMetricFamily("slicesched:loop_failures", "Failed ticks of a background loop", labels=["loop"])
        since = GaugeMetricFamily("slicesched:loop_last_ok_age_seconds",
                                  "Seconds since a background loop last ticked successfully", labels=["loop"])
        now = time.monotonic()
        for name, h in sorted(self.supervisor.loops.items()):
            failures.add_metric([name], h.failures)
            since.add_metric([name], now - (h.last_ok_at if h.last_ok_at is not None else h.started_at))
        yield failures
        yield since
        yield GaugeMetricFamily("slicesched:neo4j_up", "1 when Neo4j answers", value=1.0 if self.gate.db_up else 0.0)
        writer = self.writer
        yield GaugeMetricFamily("slicesched:gmg_writer_queue_depth", "GMG mirror rows waiting to be written "
                                "(coalesced: one per changed object)", value=writer.pending if writer else 0)
        yield CounterMetricFamily("slicesched:gmg_dropped_writes", "GMG mirror rows dropped past max_pending_writes",
                                  value=writer.rows_dropped if writer else 0)
        audit = self.audit
        yield GaugeMetricFamily("slicesched:audit_pending_entries", "Audit entries waiting to be written",
                                value=audit.pending)
        yield CounterMetricFamily("slicesched:audit_entries_written", "Audit entries written by this process",
                                  value=audit.entries_written)
        yield CounterMetricFamily("slicesched:audit_dropped_entries", "Audit entries lost past the queue's bound "
                                  "during an outage", value=audit.dropped)

    # ---- home replicas (service.live.homes) ---------------------------------------------------
    async def replan(self) -> None:
        """(Re)compute the home replicas after models or devices changed (:class:`HomePlanner`)."""
        await self.homes.replan()

    @property
    def unplaced(self) -> dict[str, str]:
        """Model uid -> why the last re-plan found it no home."""
        return self.homes.unplaced

    check_devices = staticmethod(HomePlanner.check_devices)

    # ---- the facade's commands (what the HTTP layer asks of the state) ----------------------------
    def principal_of(self, key: str) -> Principal:
        """Who ``key`` is: the admin, an executor pool, a tenant's own key (its first tenant
        admin), or a person's or service's key (its role); ``UnauthorizedError`` when unknown or
        expired. Compared in constant time where a secret is compared directly."""
        if hmac.compare_digest(key, self.settings.admin_key):
            return Principal(ADMIN)
        pool = self.pools.pool_of_key(key)
        if pool is not None:
            return Principal(EXECUTOR, pool_id=pool)
        digest = hash_key(key)
        tenant = self.state.by_key_hash.get(digest)
        if tenant is not None:
            return Principal(TENANT_ADMIN, tenant)
        member = self.access.key_of_hash(digest, self.state.wall())
        if member is None:
            raise UnauthorizedError("unknown key")
        return Principal(member.role, member.tenant_id, key_id=member.key_id, projects=member.projects)

    def check_lease(self, p: Principal, lease_id: str) -> None:
        """An executor key acts only on leases of executors its pool registered (else a 404)."""
        self.pools.check_lease(p, self.state, lease_id)

    def renew_lease(self, p: Principal, lease_id: str) -> float:
        """Extend a live lease (the caller's: :meth:`check_lease`); its new time to live in seconds."""
        self.check_lease(p, lease_id)
        return self.state.renew(lease_id)

    def heartbeat(self, executor_id: str, busy_s: float, running: Iterable[str]) -> tuple[list[str], list[str]]:
        """An executor is alive and runs ``running``: ``(leases renewed, leases to stop)``."""
        return self.state.heartbeat(executor_id, busy_s, running)

    def set_queue_policy(self, policy: QueuePolicy) -> str:
        """Every model's queue ordered by ``policy`` from now on; the previous policy's name
        (``ConflictError`` while requests wait or run)."""
        previous = self.state.policy.name
        self.state.set_queue_policy(policy)
        return previous

    # ---- queue policies ----------------------------------------------------------------------------
    def queue_policy(self, name: str, params: dict[str, Any]) -> QueuePolicy:
        """The policy ``name`` with ``params``; ``slack`` with a predictor configured gets the
        predicted latest start times (workflow steps and independent requests alike)."""
        if "latest_start" in params:
            raise InvalidInputError("slack's latest_start is the service's own (from --predictor), not a parameter")
        if name == "slack" and self.predictors.enabled:
            params = {**params, "latest_start": self.predictors.guarded(self._latest_start)}
        return make_queue_policy(name, **params)

    def _latest_start(self, q: QueuedRequest) -> float | None:
        """The slack key of a request being queued (None: no prediction; the token estimate decides)."""
        pred = self.predictors.predictor
        model = self.state.models.get(q.model)
        if pred is None or model is None:
            return None
        at = self.workflows.latest_start(q.request_id, pred)
        return at if at is not None else self.predictors.request_latest_start(q, model)

    def _public_settings(self) -> dict[str, Any]:
        """The configuration a start runs with, as the audit log records it (no key; fixed for the
        process's life: a change shows between two ``service.start`` entries)."""
        s = self.settings
        return {"placement": s.placement, "queue": s.queue, "cost_model": s.cost_model, "lease_ttl_s": s.lease_ttl_s,
                "heartbeat_s": s.heartbeat_s, "max_attempts": s.max_attempts, "max_batch": s.max_batch,
                "schedule_interval_s": s.schedule_interval_s, "slice_retention_s": s.slice_retention_s,
                "executor_kinds": list(s.executor_kinds), "bootstrap_executor_pool": s.executor_key is not None,
                "neo4j_uri": self.gate.neo4j_uri, "predictor": s.predictor, "predictor_refit_s": s.predictor_refit_s}

    async def _recover(self) -> None:
        """Rebuild the live state from the GMG and reconcile what a previous process left: its
        open Slices are closed (their leases died with it), every unfinished request is queued
        again with the leases it was granted counted as attempts."""
        repo = self.repo
        assert repo is not None
        closed = await asyncio.to_thread(repo.live.close_open_slices, time.time())
        if closed:
            log.info("closed %d slices left open by a previous process", closed)
        for t in await asyncio.to_thread(repo.live.live_tenants):
            self.state.add_tenant(t["tenant_id"], t["sla_class"] or "standard", float(t["weight"] or 1.0),
                                  int(t["priority"] or 0), t["key_hash"])
            self.access.tenant_quota[t["tenant_id"]] = quota_of_row(t)
        for p in await asyncio.to_thread(repo.governance.live_projects):
            self.access.add_project(LiveProject(p["tenant_id"], p["project_id"], quota_of_row(p),
                                                p["description"] or "", float(p["created_at"] or 0.0)))
        for k in await asyncio.to_thread(repo.governance.live_api_keys):
            self.access.add_key(ApiKeyRecord.from_row(k))
        self.access_requests.recover(await asyncio.to_thread(repo.governance.access_requests))
        for m in await asyncio.to_thread(repo.live.live_models):
            replicas = int(m["replicas"] or 1)
            if m.get("path"):  # a model directory: its config and tokenizer are read again
                try:
                    model = await asyncio.to_thread(model_from_dir, m["tenant_id"], m["model_id"], m["path"], replicas)
                except InvalidInputError as exc:
                    log.error("model %s/%s is not served: %s", m["tenant_id"], m["model_id"], exc)
                    continue
            else:
                model = LiveModel(m["tenant_id"], m["model_id"], m["family"], int(m["seed"]), replicas)
            model.created_at = float(m["created_at"] or model.created_at)
            self.state.add_model(model)
        rows = await asyncio.to_thread(repo.live.live_requests, time.time() - RECOVER_FINISHED_S)
        requeued = 0
        for row in rows:
            req = LiveRequest(row["uid"], row["tenant_id"], row["model_id"], list(row["prompt"]),
                              int(row["max_tokens"]), row["sla_class"], int(row["token_budget"]),
                              float(row["arrival"]), status=RequestStatus(row["status"]),
                              attempts=max(int(row.get("attempts") or 0), int(row.get("slices") or 0)),
                              output_tokens=list(row.get("output_tokens") or []), queued_s=row.get("queued_s"),
                              ttft_s=row.get("ttft_s"), e2e_s=row.get("e2e_s"), finished_at=row.get("finished_at"),
                              error=row.get("error"), idempotency_key=row.get("idempotency_key"),
                              body_sha=row.get("body_sha"), temperature=float(row.get("temperature") or 0.0),
                              top_p=float(row.get("top_p") or 1.0), seed=row.get("seed"),
                              slo_ttft_s=row.get("slo_ttft_s"), slo_tpot_s=row.get("slo_tpot_s"),
                              priority=row.get("priority"), project_id=row.get("project_id") or DEFAULT_PROJECT)
            if req.model_uid not in self.state.models:
                continue
            requeued += req.status not in TERMINAL
            self.state.accept(req)
        if rows:
            log.info("recovered %d requests from Neo4j (%d queued again)", len(rows), requeued)
        self.work.notify()

    # ---- quotas (admission: DurableWrites.admit) --------------------------------------------------
    def _request_ended(self, req: LiveRequest) -> None:
        self.streams.end(req)
        self.workflows.request_ended(req)
        unused = max(0, req.max_tokens - len(req.output_tokens))
        if unused:
            self.quotas.refund(req.tenant_id, req.project_id, unused, self.state.wall())

    def _lease_ended(self, req: LiveRequest, device_s: float) -> None:
        self.quotas.charge_device_s(req.tenant_id, req.project_id, device_s, self.state.wall())

    def usage_public(self, tenant_id: str, project_id: str | None) -> dict[str, Any]:
        quota = self.access.quota_of(tenant_id) if project_id is None else self.access.project(tenant_id,
                                                                                               project_id).quota
        return self.quotas.of(tenant_id, project_id).public(quota, self.state.wall())

    def _quota_metrics(self) -> Iterator[Metric]:
        """Quota usage per tenant and project (``project`` empty: the tenant's own meter)."""
        now = self.state.wall()
        labels = ["tenant", "project"]
        used = GaugeMetricFamily(f"{PREFIX}quota_tokens_used", "Tokens admitted (prompt + max_tokens) minus what "
                                 "ended requests did not generate", labels=labels)
        refused = CounterMetricFamily(f"{PREFIX}quota_requests_refused", "Submissions refused by a quota (429)",
                                      labels=labels)
        device = GaugeMetricFamily(f"{PREFIX}quota_device_seconds_last_hour", "Device-seconds charged over the last "
                                   "hour", labels=labels)
        limit = GaugeMetricFamily(f"{PREFIX}quota_tokens_per_second_limit", "The tokens/s quota (absent: none)",
                                  labels=labels)
        for (tenant_id, project_id), u in sorted(self.quotas.usage.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            values = [tenant_id, project_id or ""]
            used.add_metric(values, u.tokens_admitted - u.tokens_refunded)
            refused.add_metric(values, u.refused)
            device.add_metric(values, u.device_s.used(now))
            if u.rate is not None:
                limit.add_metric(values, u.rate)
        yield from (used, refused, device, limit)

    async def _usage_tick(self) -> None:
        """Usage that changed since the last tick onto its Tenant and Project nodes."""
        if not self.quotas.dirty or self.repo is None or not self.db_up:
            return
        dirty, self.quotas.dirty = self.quotas.dirty, set()
        now = self.state.wall()
        rows = []
        for tenant_id, project_id in sorted(dirty, key=lambda s: (s[0], s[1] or "")):
            u = self.quotas.of(tenant_id, project_id)
            rows.append({"tenant_id": tenant_id, "project_id": project_id,
                         "tokens_used": u.tokens_admitted - u.tokens_refunded, "requests_refused": u.refused,
                         "device_s_last_hour": u.device_s.used(now), "device_s_total": u.device_s.total, "at": now})
        try:
            await self.db(self.repo.governance.record_usage, rows)
        except BaseException:
            self.quotas.dirty |= dirty  # written with the next tick
            raise

    # ---- background loops ----------------------------------------------------------------------
    async def _neo4j_tick(self) -> None:
        """Check that Neo4j answers (following the managed server to a new port). Once it
        answers after an outage, the gate opens only after the steps before traffic
        (:meth:`_before_traffic`, one task across ticks: :meth:`_reopened`). Then bring the
        GMG's view of the cluster up to date if a re-plan could not write it. Every call is
        bounded, so a hung connection shows as a failed tick, never as a watcher that stopped
        watching."""
        gate = self.gate
        ok = await gate.reachable()
        if not ok:
            gate.down()
            return
        if (not gate.db_up or self.durable.unsettled) and not await gate.reopened(self._before_traffic):
            return  # still getting ready: the gate stays as it is
        if not gate.db_up:
            gate.calls.succeeded()  # what failed in the outage is not the reopened gate's
        gate.answered()
        if self.homes.gmg_dirty:
            await self.homes.cluster_written()

    async def _before_traffic(self) -> None:
        """After an outage: a new connection pool (the old one's connections died with the
        server), the submission statement planned (a cold server's first query paid here,
        once), and the requests whose end had no clear answer settled from what Neo4j
        holds (an executor's retry then meets a settled request). The writer's statements are
        planned after the gate opens."""
        gate = self.gate
        reopening = not gate.db_up
        if reopening:
            t0 = time.monotonic()
            await gate.watch_call(gate.renew_driver)
            await gate.watch_call(gate.warm_intake, bound_s=60.0)
            log.warning("Neo4j answers again at %s (ready to take traffic after %.1f s of warm-up)", gate.neo4j_uri,
                        time.monotonic() - t0)
        if self.durable.unsettled:
            await self.durable.reconcile()
        if reopening and self.writer is not None:  # the writer's statements, planned after the gate opened (their
            # rows were promised to nobody: they wait in the writer's queue meanwhile)
            gate.in_thread(self.writer.warm_up).add_done_callback(retrieve)

    async def _expiry_tick(self) -> None:
        executors = set(self.state.executors)
        writes = self.state.expire()
        removed = self.state.remove_drained()
        if writes:
            self.persist(writes)
            self.work.notify()
        for executor_id in sorted(executors - set(self.state.executors)):
            self.audit.record(SYSTEM, "executor.drop", "executor", executor_id,
                              details={"reason": f"silent for {3 * self.settings.lease_ttl_s:.0f}s"})
        if len(self.state.executors) != len(executors):  # a silent executor was dropped: new homes
            log.warning("executor(s) silent for %.0fs dropped; re-planning homes", 3 * self.settings.lease_ttl_s)
            await self.replan()
        elif removed:
            await self.homes.cluster_written()
        if writes or removed:
            self.changed.set()

    async def _retention_tick(self) -> None:
        """Bounded retention: live Slices older than ``slice_retention_s`` go; then requests,
        workflows, audit entries and observations past theirs are archived and deleted, a
        bounded batch per call (:mod:`service.live.retention`)."""
        assert self.repo is not None and self.retention is not None
        deleted = await self.db(self.repo.live.delete_old_live_slices, time.time() - self.settings.slice_retention_s)
        if deleted:
            log.info("retention: deleted %d live slices", deleted)
        await self.retention.tick(lambda fn, now: self.db(fn, now, bound_s=300.0))


def end_process(why: str) -> None:
    """Stop this serve process as a SIGTERM does (the HTTP server drains and the service stops):
    what a deposed leader or a failed take-over does, so that whatever runs the process (a
    Deployment, systemd) starts it again, as a standby."""
    log.error("stopping the service: %s", why)
    os.kill(os.getpid(), signal.SIGTERM)


def quota_of_row(row: dict[str, Any]) -> Quota:
    """A Tenant's or Project's quota from its ``quota_*`` properties (null: no limit)."""
    return Quota.from_dict({"tokens_per_s": row.get("quota_tokens_per_s"),
                            "device_s_per_hour": row.get("quota_device_s_per_hour"),
                            "mem_bytes": row.get("quota_mem_bytes")})
