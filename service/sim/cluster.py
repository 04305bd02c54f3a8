"""A simulated cluster at iteration granularity, driven by the event engine: the facade over
its parts.

- :mod:`service.sim.replica` and :mod:`service.sim.batcher`: a replica, its continuous batching and KV;
- :mod:`service.sim.routing`: which replica's queue a request waits in;
- :mod:`service.sim.resource`: device timelines and FIFO links;
- :mod:`service.sim.slices`: placed slices and link transfers;
- :mod:`service.sim.state`: all mutable state in one dataclass, and how a what-if forks it.

Pure: no wall clock, no I/O; the only randomness is the injected ``numpy.random.Generator``
(router tie-breaks). Same inputs and seed give the same event log.

Queue policies and estimates: see :mod:`service.sim.routing` (what a queued request carries)
and :mod:`service.core.queue`. Every completion is fed to ``estimator.observe`` (online
calibration during the run; forks do not calibrate).

Memory
    Weights are allocated at construction (``InvalidInputError`` if they do not fit). Any
    forced allocation over a device's limit is recorded as a violation, never absorbed. Placed
    slices hold ``resident_bytes`` from commit to finish and their input bytes as a transfer
    buffer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from service.core.cost import CostModel, IterationOverhead
from service.core.memory import MemoryLedger
from service.core.queue import QueuePolicy, WaitingQueue, make_waiting_queue
from service.domain.cluster import ClusterSpec, Device
from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS, ModelConfig
from service.domain.request import RequestSpec, Workload
from service.sim.batcher import Batcher
from service.sim.config import SimConfig
from service.sim.engine import (
    Engine,
    Event,
    IterationFinished,
    RequestArrived,
    SliceFinished,
    StageFinished,
    StageReady,
    StepRequested,
    TransferFinished,
)
from service.sim.iteration import CostTables, IterationCostTable, weight_bytes
from service.sim.pipeline import SlicedReplicas
from service.sim.replica import (
    Live,
    OutputEstimator,
    Replica,
    ReplicaSpec,
    build_replica,
    dropped_outcome,
    request_outcome,
)
from service.sim.report import MetricsCollector, RequestOutcome, SimObserver, SimReport
from service.sim.resource import Placement, SliceSpec, SliceTiming, TransferTiming
from service.sim.routing import Routing
from service.sim.sharing import SharedDevices
from service.sim.sla import SLA_CLASSES, SlaClass
from service.sim.slices import PlacedSlices
from service.sim.state import ForkScope, SimState

__all__ = [
    "SLA_CLASSES", "Placement", "ReplicaSpec", "SimulatedCluster", "SlaClass", "SliceSpec",
    "SliceTiming", "TransferTiming",
]

Router = Callable[[RequestSpec, Sequence[str], "SimulatedCluster"], str]
# Called with every finished or dropped request's outcome; the events it returns follow from
# the same handler (a workflow releasing its next steps: service.sim.workflow).
OnDone = Callable[[RequestOutcome], Iterable[Event]]


class SimulatedCluster(PlacedSlices, SlicedReplicas, SharedDevices):
    """The cluster under simulation. Construct, :meth:`submit` requests, :meth:`run`, then
    :meth:`report`. The scheduler may :meth:`commit` slices at the current time between runs.

    ``router(request, replica_ids, cluster) -> replica_id`` picks among the replicas of the
    request's model; the default sends it to the one with the fewest requests in it, ties
    broken by ``rng``.
    """

    def __init__(self, spec: ClusterSpec, replicas: Sequence[ReplicaSpec], cost_model: CostModel, *,
                 rng: np.random.Generator, sla_classes: dict[str, SlaClass] | None = None,
                 config: SimConfig | None = None, record_log: bool = False, router: Router | None = None,
                 observers: Iterable[SimObserver] = (),
                 model_configs: dict[str, ModelConfig] | None = None,
                 overheads: dict[str, IterationOverhead] | None = None,
                 queue_policy: QueuePolicy | None = None, estimator: OutputEstimator | None = None,
                 tenant_priority: dict[str, int] | None = None,
                 tenant_weight: dict[str, float] | None = None, on_done: OnDone | None = None) -> None:
        self.spec = spec
        self.on_done = on_done
        self.config = config or SimConfig()
        self.queue_policy = queue_policy  # None: arrival order
        self.estimator = estimator
        self.tenant_priority = dict(tenant_priority or {})  # missing tenants: 0
        self.tenant_weight = dict(tenant_weight or {})  # missing tenants: 1.0
        for t, w in self.tenant_weight.items():
            if not (0.0 < w < math.inf):
                raise InvalidInputError(f"tenant {t!r}: weight must be finite and > 0, got {w}", culprit=t)
        if queue_policy is not None and queue_policy.needs_estimate and estimator is None:
            raise InvalidInputError(f"queue policy {queue_policy.name!r} needs an estimator", culprit=queue_policy.name)
        self.overheads = dict(overheads or {})  # per model name; none means zero
        self.cost_model = cost_model
        self._tables = CostTables(cost_model)  # shared with every fork (see CostTables)
        self.sla_classes = dict(sla_classes or SLA_CLASSES)
        self.router = router
        self._configs = model_configs or MODEL_CONFIGS
        self._devices: dict[str, Device] = {d.device_id: d for d in spec.devices}
        ledger = MemoryLedger({d.device_id: d.mem_bytes for d in spec.devices},
                              margin_fraction=self.config.margin_fraction)
        self._assemble(SimState.empty(list(self._devices), ledger, rng), Engine(record_log=record_log), observers)
        for rs in replicas:
            self._add_replica(rs)

    def model_config(self, name: str) -> ModelConfig:
        """The config of the model ``name`` (a replica spec's ``model``)."""
        return self._configs[name]

    def _assemble(self, state: SimState, engine: Engine, observers: Iterable[SimObserver]) -> None:
        """Wire the parts over ``state`` (at construction and in a fork)."""
        self.state = state
        self.engine = engine
        self.metrics = MetricsCollector(list(self._devices))
        self._observers: list[SimObserver] = [self.metrics, *observers]
        track = self.queue_policy is not None and self.queue_policy.fair_share
        self._batcher = Batcher(state.ledger, state.timelines, state.served, track_served=track,
                                kv_watermark_fraction=self.config.kv_watermark_fraction,
                                paged=self.config.kv == "paged", block_tokens=self.config.kv_block_tokens,
                                record_token_gaps=self.config.record_token_gaps)
        router = self.router
        self._routing = Routing(state, self._batcher,
                                choose=None if router is None else (lambda req, ids: router(req, ids, self)),
                                queue_policy=self.queue_policy, estimator=self.estimator,
                                tenant_priority=self.tenant_priority, tenant_weight=self.tenant_weight,
                                sla_classes=self.sla_classes)
        engine.on(RequestArrived, self._on_request_arrived)
        engine.on(StepRequested, self._on_step_requested)
        engine.on(IterationFinished, self._on_iteration_finished)
        engine.on(SliceFinished, self._on_slice_finished)
        engine.on(TransferFinished, self._on_transfer_finished)
        engine.on(StageReady, self._on_stage_ready)
        engine.on(StageFinished, self._on_stage_finished)

    def _add_replica(self, rs: ReplicaSpec) -> None:
        if rs.replica_id in self.state.replicas:
            raise InvalidInputError(f"duplicate replica id {rs.replica_id!r}", culprit=rs.replica_id)
        if self.config.device_sharing == "executor" and rs.stages:
            raise InvalidInputError(f"replica {rs.replica_id!r}: executor sharing models whole replicas, "
                                    "not sliced ones", culprit=rs.replica_id)
        waiting: WaitingQueue[Live] = make_waiting_queue(self.queue_policy)
        r = build_replica(rs, cluster=self.spec, devices=self._devices, configs=self._configs,
                          tables=self._tables, overheads=self.overheads, ledger=self.state.ledger,
                          waiting=waiting)
        self.state.add_replica(r)

    # ---- public surface -----------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.engine.now_s

    @property
    def ledger(self) -> MemoryLedger:
        return self.state.ledger

    @property
    def version(self) -> tuple[float, int, int, int]:
        """Changes whenever the state may have: with the clock, every event handled or scheduled
        (requests submitted, slices committed, transfers), every replica added, removed or
        drained, every arrival noted. Equal versions of one cluster: the same state (what-if
        memos are keyed on it)."""
        return self.engine.now_s, self.engine.num_handled, self.engine.num_scheduled, self.state.changes

    @property
    def rng(self) -> np.random.Generator:
        return self.state.rng

    @property
    def tokens_out(self) -> int:
        """Output tokens produced so far, all replicas."""
        return self.state.tokens_out

    @property
    def kv_watermark_fraction(self) -> float:
        return self.config.kv_watermark_fraction

    @property
    def replica_ids(self) -> list[str]:
        return list(self.state.replicas)

    def replica_spec(self, replica_id: str) -> ReplicaSpec:
        return self.state.replicas[replica_id].spec

    def cost_table(self, replica_id: str) -> IterationCostTable:
        """The replica's memoised iteration-cost table (lookup and miss counters included)."""
        return self.state.replicas[replica_id].table

    def replica_load(self, replica_id: str) -> int:
        """Requests routed to the replica and not finished (waiting, prefilling, decoding)."""
        return self.state.replicas[replica_id].load()

    def can_ever_fit(self, request: RequestSpec, replica_id: str) -> bool:
        """Could the whole request's KV fit on the replica were it otherwise empty? (A router
        must not send a request where it can never run: replicas of one model may differ in
        memory.)"""
        return self._routing.fits_ever(request, [replica_id])

    def device_free_at_s(self, device_id: str) -> float:
        """End of the work committed on the device so far, placed-slice reservations included."""
        return self.state.timelines.free_at_s(device_id)

    def reservations(self, device_id: str) -> list[tuple[float, float, str]]:
        """Future windows ``(start_s, end_s, slice_id)`` of placed slices on the device."""
        return self.state.timelines.reservations(device_id)

    @property
    def served_tokens(self) -> dict[str, float]:
        """Tokens served per tenant so far (prompt plus output); kept for fair-share policies only."""
        return dict(self.state.served)

    def submit(self, requests: Workload | Iterable[RequestSpec]) -> None:
        """Schedule the arrivals (each at its ``arrival_s``, which must not be in the past)."""
        reqs = requests.requests if isinstance(requests, Workload) else requests
        for req in reqs:
            self.engine.schedule(RequestArrived(time_s=req.arrival_s, request=req))

    def note_arrivals(self, requests: Iterable[RequestSpec], seen_since: Mapping[str, float] | None = None) -> None:
        """Count requests as arrived, for load forecasts (:meth:`arrivals_since`), without
        simulating them: a mirror of a live cluster knows what came, not what its queues did.
        ``seen_since``: tenant -> since when its arrivals have been watched, where that is earlier
        than the first of ``requests`` (a mirror's window is recent history of a longer past)."""
        requests = list(requests)
        self.state.changes += 1
        self.state.arrived.extend(requests)
        self.state.arrived.sort(key=lambda r: r.arrival_s)
        seen = self.state.seen_since
        for req in requests:
            seen[req.tenant_id] = min(seen.get(req.tenant_id, math.inf), req.arrival_s)
        for tenant, since in (seen_since or {}).items():
            seen[tenant] = min(seen.get(tenant, math.inf), since)

    def seen_since(self, tenant_id: str) -> float | None:
        """Since when the tenant's arrivals have been watched (its first arrival, or earlier as
        :meth:`note_arrivals` was told); ``None`` before any (load forecasts: a tenant seen for
        less than their horizon has a shorter history to go by)."""
        return self.state.seen_since.get(tenant_id)

    def release(self, requests: Iterable[RequestSpec], at_s: float) -> None:
        """Hand requests that arrived earlier (each at its own ``arrival_s``, which its SLA counts
        from) to the cluster at ``at_s``, in arrival order: a live backlog, queued as it is now."""
        for req in sorted(requests, key=lambda r: r.arrival_s):
            self.engine.schedule(RequestArrived(time_s=max(at_s, req.arrival_s), request=req, released=True))

    def run(self, until: float | None = None) -> None:
        self.engine.run(until)

    def run_to(self, time_s: float) -> None:
        """Run until ``time_s`` and set the clock there (even when the last event came earlier)."""
        self.engine.run(time_s)
        self.engine.advance_to(time_s)

    def report(self) -> SimReport:
        peaks = {d: self.ledger.peak_bytes(d) for d in self._devices}
        report = self.metrics.report(makespan_s=self.engine.now_s, num_events=self.engine.num_handled,
                                     peak_mem_bytes=peaks, violations=self.ledger.violations)
        report.kv = self.config.kv
        report.preemptions = self._batcher.preemptions
        report.recomputed_tokens = self._batcher.recomputed_tokens
        return report

    def in_flight(self) -> list[tuple[str, RequestSpec]]:
        """(replica_id, request) of every request routed to a replica and not finished."""
        return self.state.in_flight()

    def late_in_flight(self, at_s: float) -> list[RequestSpec]:
        """Requests in flight at ``at_s`` that have already missed their SLA: past their end-to-end
        deadline, or still without a first token past their TTFT target."""
        first = self.state.first_token_s()
        late = []
        for _, req in self.state.in_flight():
            sla = self.sla_classes.get(req.sla_class) or self.sla_classes["standard"]
            waited = at_s - req.arrival_s
            no_token = math.isnan(first.get(req.request_id, math.nan))
            if waited > sla.e2e_s or (no_token and waited > sla.ttft_target_s(req.prompt_tokens)):
                late.append(req)
        return late

    @property
    def token_gaps(self) -> list[tuple[float, int]]:
        """``(seconds, tokens)``: the time between consecutive output tokens of a request, for
        every token but the first, weighted by how many tokens had that gap (recorded only with
        ``SimConfig.record_token_gaps``; empty otherwise)."""
        return self._batcher.token_gaps or []

    def kv_tokens(self, replica_id: str) -> int:
        """KV tokens the replica holds now (for tests and the scheduler's view)."""
        return self.state.replicas[replica_id].kv_tokens

    # ---- handlers -----------------------------------------------------------------------
    def _on_request_arrived(self, ev: RequestArrived) -> list[Event]:
        req = ev.request
        if not ev.released:
            self.state.arrived.append(req)
            self.state.seen_since.setdefault(req.tenant_id, req.arrival_s)
        routing = self._routing
        candidates = routing.routable(req, self.engine.now_s)
        if candidates and not routing.fits_ever(req, candidates):
            candidates = []
        if not candidates:
            return self._notify_finished(dropped_outcome(req))
        rid = routing.route(req, candidates)
        r = self.state.replicas[rid]
        routing.enqueue(r, req)
        if r.busy or r.step_pending:
            return []
        r.step_pending = True
        return [StepRequested(time_s=ev.time_s, replica_id=rid)]

    def _on_step_requested(self, ev: StepRequested) -> list[Event]:
        r = self.state.replicas.get(ev.replica_id)
        if r is None:  # removed after draining
            return []
        if self.state.ready_at.get(ev.replica_id, 0.0) == ev.time_s and r.spec.guest and not r.waiting:
            self._routing.steal(r)
        r.step_pending = False
        if r.busy:
            return []
        return self._start_iteration(r, ev.time_s)

    def _start_iteration(self, r: Replica, now: float) -> list[Event]:
        dev = self._executor_device(r)
        if dev is not None:  # it waits its pick there (service.sim.sharing)
            return self._want(r, dev, now)
        ev = self._batcher.start_iteration(r, now, self._routing.pull_from(r, now))
        if ev is None:  # idle: an owner gives its devices to the guest slices waiting there
            return self._serve_guests(r.device_ids, now) if not r.spec.guest else []
        return [ev]

    def _on_iteration_finished(self, ev: IterationFinished) -> list[Event]:
        now = ev.time_s
        st = self.state
        r = st.replicas.get(ev.replica_id)
        if r is None or r.iteration != ev.iteration:  # evicted (service.sim.elastic): abandoned
            return self._release(ev.replica_id, now, None)
        if not r.spec.stages:  # a sliced replica's slices were reported one by one
            for d in r.device_ids:
                for obs in self._observers:
                    obs.slice_executed(d, r.current_start_s, now, r.spec.replica_id)
        finished, kv_delta, tokens = self._batcher.finish_iteration(r, now)
        st.tokens_out += tokens
        done: list[Event] = []
        for live in finished:
            done += self._finished(r, live, now)
        if st.dynamic:
            st.last_active_s[ev.replica_id] = now
            if ev.replica_id in st.draining and r.load() == 0:
                return (done + self._remove_replica(ev.replica_id, now) + self._release(ev.replica_id, now, None)
                        + self._hand_over(r, now))
        follow = done + (self._guest_in_gap(r, now) if not r.spec.guest else [])
        if self._executor_device(r) is not None:
            follow += self._release(ev.replica_id, now, r)
        else:  # (replicas waiting on its devices under executor sharing first)
            follow += self._hand_over(r, now) + self._start_iteration(r, now)
        if kv_delta < 0 and st.shared:
            follow += self._wake_idle(r.device_ids, now)
        return follow

    def _wake_idle(self, device_ids: Iterable[str], now: float) -> list[Event]:
        """Freed memory may let an idle replica on these devices admit its queue head."""
        out: list[Event] = []
        st = self.state
        for dev in device_ids:
            for rid in st.by_device[dev]:
                r = st.replicas[rid]
                if (r.waiting or r.preempted) and not r.busy and not r.step_pending:
                    r.step_pending = True
                    out.append(StepRequested(time_s=now, replica_id=rid))
        return out

    # ---- outcomes -----------------------------------------------------------------------
    def _finished(self, r: Replica, live: Live, now: float) -> list[Event]:
        if self.estimator is not None:
            self.estimator.observe(live.spec, live.spec.output_tokens)
        return self._notify_finished(request_outcome(r, live, now, self.sla_classes))

    def _notify_finished(self, outcome: RequestOutcome) -> list[Event]:
        for obs in self._observers:
            obs.request_finished(outcome)
        return [] if self.on_done is None else list(self.on_done(outcome))

    # ---- what-if support ----------------------------------------------------------------
    def affected(self, device_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """(devices, replicas) that work on ``device_ids`` can influence: the devices plus
        every device of a replica touching one of them, closed under that relation."""
        return self.state.affected(device_ids)

    def fork(self, device_ids: Iterable[str]) -> SimulatedCluster:
        """A copy of the part of the state that ``device_ids`` can influence, at the same time.

        The fork holds the affected replicas (with their queued and running requests), the
        placed slices and pending transfers touching affected devices, a copy of the ledger
        and the link states (see :class:`~service.sim.state.SimState` for every field's rule).
        Future arrivals are not carried: the fork predicts what happens to the work already in
        the system. The original is not changed; the fork does not calibrate the estimator.
        """
        devices, replicas = self.affected(device_ids)
        state = self.state.fork(ForkScope(frozenset(devices), frozenset(replicas), self.engine.now_s))
        links = self.state.links

        def keep(ev: Event) -> bool:
            if isinstance(ev, (IterationFinished, StepRequested, StageReady, StageFinished)):
                return ev.replica_id in replicas
            if isinstance(ev, SliceFinished):
                return ev.slice_id in state.slices
            if isinstance(ev, TransferFinished):
                return links.timing(ev.transfer_id).dst in devices
            return False  # arrivals: the fork predicts the work already in the system

        f = SimulatedCluster.__new__(SimulatedCluster)
        f.spec, f.config, f.cost_model, f.sla_classes = self.spec, self.config, self.cost_model, self.sla_classes
        f.queue_policy, f.router, f.overheads = self.queue_policy, self.router, self.overheads
        f.estimator = None  # a what-if must not calibrate the real estimator (no arrivals to estimate)
        f.on_done = None  # nor release the next steps of the real workflows
        f.tenant_priority, f.tenant_weight = self.tenant_priority, self.tenant_weight
        f._configs, f._devices, f._tables = self._configs, self._devices, self._tables
        f._assemble(state, self.engine.fork(keep), ())
        return f

    # ---- run-time replica changes -----------------------------------------------------------
    def add_replica(self, spec: ReplicaSpec, *, weights_from: str | None = None,
                    startup_s: float = 0.0) -> float | None:
        """Create a replica now; returns the time it starts taking requests, or ``None`` when
        its weights do not fit (nothing changes then). It is ready no earlier than
        ``startup_s`` from now (an engine's start-up), and after its weights have arrived.

        With ``weights_from`` (a device holding the model's weights) each device's shard is
        copied over the link from there (FIFO on the link); the replica is ready when the last
        shard has arrived, and then takes over part of its tenant's queued requests.
        """
        st = self.state
        st.dynamic = True
        try:
            self._add_replica(spec)
        except InvalidInputError:
            return None
        now = self.engine.now_s
        ready = now + startup_s
        if weights_from is not None:
            r = st.replicas[spec.replica_id]
            shards = r.weights_on or (-(-weight_bytes(self._configs[spec.model]) // len(spec.device_ids)),) * r.tp
            for d, shard in zip(spec.device_ids, shards, strict=True):
                if d == weights_from:
                    continue
                tt = self.transfer(weights_from, d, shard, buffer=False)  # into the weights allocation
                ready = max(ready, tt.arrival_s)
        st.ready_at[spec.replica_id] = ready
        st.last_active_s[spec.replica_id] = ready
        st.replicas[spec.replica_id].step_pending = True
        self.engine.schedule(StepRequested(time_s=ready, replica_id=spec.replica_id))
        return ready

    def drain_replica(self, replica_id: str) -> None:
        """Stop routing to the replica; its queued requests move to the tenant's other
        replicas, and it is removed (memory freed) once its running requests finish."""
        st = self.state
        if replica_id not in st.replicas:
            raise InvalidInputError(f"unknown replica {replica_id!r}", culprit=replica_id)
        st.dynamic = True
        st.changes += 1
        st.draining.add(replica_id)
        r = st.replicas[replica_id]
        now = self.engine.now_s
        for rid in self._routing.hand_off(r, now):
            self.engine.schedule(StepRequested(time_s=now, replica_id=rid))
        if r.load() == 0 and not r.busy:
            for ev in self._remove_replica(replica_id, now):
                self.engine.schedule(ev)

    def replica_state(self, replica_id: str) -> tuple[int, int, bool, float]:
        """(waiting, running, draining, idle seconds) of a replica."""
        st = self.state
        r = st.replicas[replica_id]
        running = len(r.prefilling) + r.num_decodes
        idle = 0.0
        waiting = len(r.waiting) + len(r.preempted)
        if waiting + running == 0:
            idle = max(0.0, self.engine.now_s - st.last_active_s.get(replica_id, 0.0))
        return waiting, running, replica_id in st.draining, idle

    def arrivals_since(self, since_s: float) -> list[RequestSpec]:
        """Requests that arrived at or after ``since_s`` (oldest first)."""
        return self.state.arrivals_since(since_s)

    def ready_at_s(self, replica_id: str) -> float:
        return self.state.ready_at.get(replica_id, 0.0)

    def _remove_replica(self, replica_id: str, now: float) -> list[Event]:
        r = self.state.remove_replica(replica_id)
        ledger = self.ledger
        for a in [*r.kv_allocs, *r.act_allocs]:
            ledger.free(a)
        for d in r.device_ids:
            for a in [a for a in ledger.allocations(d) if a.owner == f"{replica_id}/weights"]:
                ledger.free(a)
        return self._wake_idle(r.device_ids, now)
