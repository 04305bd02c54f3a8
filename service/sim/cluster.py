"""A simulated cluster at iteration granularity: continuous-batching replicas, placed slices,
links and a memory ledger, driven by the event engine.

Pure: no wall clock, no I/O; the only randomness is the injected ``numpy.random.Generator``
(router tie-breaks). Same inputs and seed give the same event log.

Replicas and batching
    A replica is a model on one or more devices (tensor parallel: compute divided by the
    number of devices plus two ring all-reduces per layer over their link, see
    :class:`~service.sim.iteration.IterationCostTable`). Each iteration batches every running
    decode (one token each) and then prompt chunks (chunked prefill) up to
    ``max_batched_tokens``: first the partially prefilled requests in admission order, then
    waiting requests in the queue policy's order. A waiting request is admitted when its prompt's KV (plus
    one token) fits under the device limit minus a watermark; if the head of the queue does not
    fit, admission stops (no overtaking of the selected request, no preemption); admission also keeps room for
    the activations of a full iteration (``max_batched_tokens`` tokens). The iteration that finishes a
    prompt emits its first token; every later iteration emits one more. Iterations of a busy
    replica run back to back; one event per iteration per replica, never per token.

Queue policies and output-length estimates
    Each replica's waiting queue follows a :class:`~service.core.queue.QueuePolicy` (default:
    arrival order, kept in a deque). At arrival a request gets its token budget from the
    ``estimator`` (if any; the true length for an oracle policy without one) and its tenant's
    priority and weight; the head is the policy's next request (head-of-line: if it does not
    fit, admission stops). For fair-share policies the cluster counts served tokens per tenant
    (prompt tokens at admission, one per output token as it is produced). Every completion is
    fed to ``estimator.observe`` (online calibration during the run; forks do not calibrate).

Memory
    Weights are allocated at construction (``InvalidInputError`` if they do not fit). KV of a
    replica is one allocation per device (``kv_cache``, owner ``<replica>/kv``): a request is
    admitted only when its prompt plus its whole output (the ``max_tokens`` it declares; the
    traces' output lengths stand for it) fits, so decoding never outgrows memory and no
    preemption is needed; released at completion. Any forced allocation over a device's limit
    is recorded as a violation, never absorbed. Live
    activations of an iteration are allocated for its duration. Placed slices hold
    ``resident_bytes`` from commit to finish and their input bytes as a transfer buffer.

Links
    A directed link serialises transfers first-come first-served: a transfer starts when the
    link is free, occupies it for ``bytes / bandwidth`` and arrives ``latency`` later
    (propagation overlaps the next transfer's wire time). Chosen over fair sharing because a
    committed transfer's arrival time never changes afterwards, which the what-if needs.

Devices
    A device runs one slice at a time. Placed slices reserve a window; a replica iteration
    starts at the earliest time all its devices are free for its whole duration (it waits
    behind a reservation rather than overlapping it).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from service.core.cost import NO_OVERHEAD, CostModel, IterationOverhead, OpFeatures
from service.core.memory import Allocation, MemoryLedger
from service.core.queue import FifoPolicy, QueuedRequest, QueuePolicy, RequestQueue
from service.domain.cluster import ClusterSpec, Device
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload
from service.models.family import MODEL_CONFIGS, ModelConfig
from service.sim.engine import (
    Engine,
    Event,
    IterationFinished,
    RequestArrived,
    SliceFinished,
    StepRequested,
    TransferFinished,
)
from service.sim.iteration import (
    IterationCostTable,
    activation_bytes_per_token,
    kv_bytes_per_token,
    weight_bytes,
)
from service.sim.report import MetricsCollector, RequestOutcome, SimObserver, SimReport
from service.sim.sla import SLA_CLASSES, SlaClass

__all__ = [
    "SLA_CLASSES", "Placement", "ReplicaSpec", "SimulatedCluster", "SlaClass", "SliceSpec",
    "SliceTiming", "TransferTiming",
]


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    replica_id: str
    model: str  # a name in MODEL_CONFIGS
    device_ids: tuple[str, ...]  # one device, or several for tensor parallelism
    max_batched_tokens: int = 2048  # token budget of one iteration (a decode counts one)
    max_num_seqs: int = 256  # admitted sequences at most (prefilling plus decoding)
    tenant_id: str | None = None  # serves only this tenant's requests (None: any tenant of the model)
    guest: bool = False  # added at run time outside the tenant's home devices


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Work the scheduler places outside any replica's batching (e.g. ops of one iteration)."""

    slice_id: str
    tenant_id: str
    ops: tuple[OpFeatures, ...]
    resident_bytes: int = 0  # activations, workspace and any weights it holds while placed
    input_bytes: int = 0  # bytes it needs from input_device_id before it can start
    input_device_id: str | None = None  # None: inputs are already on the target device


@dataclass(frozen=True, slots=True)
class Placement:
    slice_id: str
    device_id: str
    start_s: float  # earliest start wanted; the slice starts later if it must wait


@dataclass(frozen=True, slots=True)
class TransferTiming:
    transfer_id: int
    src: str
    dst: str
    size_bytes: int
    start_s: float  # the link became free for it
    arrival_s: float  # start + bytes / bandwidth + latency


@dataclass(frozen=True, slots=True)
class SliceTiming:
    slice_id: str
    device_id: str
    inputs_ready_s: float  # when its inputs are on the device (commit time without inputs)
    start_s: float  # actual start: >= placement start, inputs ready and device free
    finish_s: float


class OutputEstimator(Protocol):
    """What the cluster needs of an output-length estimator (see ``learned.estimator``)."""

    def estimate(self, req: RequestSpec) -> int: ...

    def observe(self, req: RequestSpec, true_output_tokens: int) -> None: ...


class _Live:
    """Mutable state of one request inside a replica."""

    __slots__ = ("admitted_s", "estimate", "first_iter", "first_token_s", "prefilled", "spec")

    def __init__(self, spec: RequestSpec, estimate: int = 0) -> None:
        self.spec = spec
        self.estimate = estimate  # output-token budget given at arrival (0: none)
        self.prefilled = 0
        self.admitted_s = math.nan
        self.first_token_s = math.nan
        self.first_iter = -1


class _Replica:
    """Mutable state of one replica (plain attributes; the simulator owns all of them)."""

    act_allocs: list[Allocation]
    act_bytes_per_token: float
    busy: bool
    config: ModelConfig
    current: list[tuple[_Live, int]]  # this iteration's prefill chunks
    current_start_s: float
    decode_context_sum: int
    decoding_by_tenant: dict[str, int]
    device_ids: tuple[str, ...]
    ends: np.ndarray  # end time of every iteration so far, by iteration index
    finishing: dict[int, list[_Live]]  # iteration index -> requests whose last token it produces
    iteration: int
    kv_allocs: list[Allocation]
    kv_bytes_per_token: float
    kv_tokens: int
    num_decodes: int
    prefilling: deque[_Live]
    spec: ReplicaSpec
    step_pending: bool
    table: IterationCostTable
    tokens_out: int
    tp: int
    waiting: deque[_Live] | RequestQueue[_Live]

    __slots__ = (
        "act_allocs",
        "act_bytes_per_token",
        "busy",
        "config",
        "current",
        "current_start_s",
        "decode_context_sum",
        "decoding_by_tenant",
        "device_ids",
        "ends",
        "finishing",
        "iteration",
        "kv_allocs",
        "kv_bytes_per_token",
        "kv_tokens",
        "num_decodes",
        "prefilling",
        "spec",
        "step_pending",
        "table",
        "tokens_out",
        "tp",
        "waiting",
    )

    def clone(self) -> _Replica:
        other = _Replica.__new__(_Replica)
        lives: dict[int, _Live] = {}

        def c(x: _Live) -> _Live:
            got = lives.get(id(x))
            if got is None:
                got = lives[id(x)] = copy.copy(x)
            return got

        for name in _Replica.__slots__:
            setattr(other, name, getattr(self, name))
        other.waiting = (deque(c(x) for x in self.waiting) if isinstance(self.waiting, deque)
                         else self.waiting.copy(c))
        other.decoding_by_tenant = dict(self.decoding_by_tenant)
        other.prefilling = deque(c(x) for x in self.prefilling)
        other.finishing = {k: [c(x) for x in v] for k, v in self.finishing.items()}
        other.current = [(c(x), n) for x, n in self.current]
        other.ends = self.ends.copy()
        other.kv_allocs = list(self.kv_allocs)
        other.act_allocs = list(self.act_allocs)
        return other


@dataclass(slots=True)
class _PlacedSlice:
    spec: SliceSpec
    timing: SliceTiming
    allocs: list[Allocation]


Router = Callable[[RequestSpec, Sequence[str], "SimulatedCluster"], str]


class SimulatedCluster:
    """The cluster under simulation. Construct, :meth:`submit` requests, :meth:`run`, then
    :meth:`report`. The scheduler may :meth:`commit` slices at the current time between runs.

    ``router(request, replica_ids, cluster) -> replica_id`` picks among the replicas of the
    request's model; the default sends it to the one with the fewest requests in it, ties
    broken by ``rng``.
    """

    def __init__(self, spec: ClusterSpec, replicas: Sequence[ReplicaSpec], cost_model: CostModel, *,
                 rng: np.random.Generator, sla_classes: dict[str, SlaClass] | None = None,
                 margin_fraction: float = 0.05, kv_watermark_fraction: float = 0.01,
                 record_log: bool = False, router: Router | None = None,
                 observers: Iterable[SimObserver] = (),
                 model_configs: dict[str, ModelConfig] | None = None,
                 overheads: dict[str, IterationOverhead] | None = None,
                 queue_policy: QueuePolicy | None = None, estimator: OutputEstimator | None = None,
                 tenant_priority: dict[str, int] | None = None,
                 tenant_weight: dict[str, float] | None = None) -> None:
        self.spec = spec
        # Queueing: None or fifo keeps the plain deque (the fast path, arrival order).
        self.queue_policy = queue_policy
        self.estimator = estimator
        self.tenant_priority = dict(tenant_priority or {})  # missing tenants: 0
        self.tenant_weight = dict(tenant_weight or {})  # missing tenants: 1.0
        for t, w in self.tenant_weight.items():
            if not (0.0 < w < math.inf):
                raise InvalidInputError(f"tenant {t!r}: weight must be finite and > 0, got {w}", culprit=t)
        self._fifo = queue_policy is None or isinstance(queue_policy, FifoPolicy)
        if queue_policy is not None and queue_policy.needs_estimate and estimator is None:
            raise InvalidInputError(f"queue policy {queue_policy.name!r} needs an estimator", culprit=queue_policy.name)
        self._track_served = queue_policy is not None and queue_policy.fair_share
        self._served: dict[str, float] = {}  # tokens served per tenant (fair-share policies only)
        self.overheads = dict(overheads or {})  # per model name; none means zero
        self.cost_model = cost_model
        self.rng = rng
        self.sla_classes = dict(sla_classes or SLA_CLASSES)
        self.kv_watermark_fraction = kv_watermark_fraction
        self.router = router
        self._devices: dict[str, Device] = {d.device_id: d for d in spec.devices}
        self.ledger = MemoryLedger({d.device_id: d.mem_bytes for d in spec.devices},
                                   margin_fraction=margin_fraction)
        self.engine = Engine(record_log=record_log)
        self.metrics = MetricsCollector(list(self._devices))
        self._observers: list[SimObserver] = [self.metrics, *observers]
        self._free_at: dict[str, float] = dict.fromkeys(self._devices, 0.0)
        self._reserved: dict[str, list[tuple[float, float, str]]] = {d: [] for d in self._devices}
        self._link_free_at: dict[tuple[str, str], float] = {}
        self._slices: dict[str, _PlacedSlice] = {}  # placed and not finished
        self._slice_timings: dict[str, SliceTiming] = {}  # every slice ever placed
        self._transfers: dict[int, TransferTiming] = {}
        self._next_transfer_id = 0
        self._transfer_buffers: dict[int, Allocation] = {}
        self._replicas: dict[str, _Replica] = {}
        self._by_model: dict[str, list[str]] = {}
        self._by_device: dict[str, list[str]] = {d: [] for d in self._devices}
        self._shared = False
        configs = model_configs or MODEL_CONFIGS
        self._configs = configs
        # Run-time replica changes (the slice placement policy): readiness, draining, activity.
        self._dynamic = False
        self._ready_at: dict[str, float] = {}
        self._draining: set[str] = set()
        self._last_active_s: dict[str, float] = {}
        self._arrived: list[RequestSpec] = []  # in arrival order, for load forecasts
        self.tokens_out = 0  # output tokens produced so far, all replicas
        for rs in replicas:
            self._add_replica(rs, configs)
        self._wire()

    # ---- construction -------------------------------------------------------------------
    def _add_replica(self, rs: ReplicaSpec, configs: dict[str, ModelConfig]) -> None:
        if rs.replica_id in self._replicas:
            raise InvalidInputError(f"duplicate replica id {rs.replica_id!r}", culprit=rs.replica_id)
        if rs.model not in configs:
            raise InvalidInputError(f"replica {rs.replica_id}: unknown model {rs.model!r}", culprit=rs.model)
        if not rs.device_ids or len(set(rs.device_ids)) != len(rs.device_ids):
            raise InvalidInputError(f"replica {rs.replica_id}: needs distinct device ids", culprit=rs.replica_id)
        for d in rs.device_ids:
            if d not in self._devices:
                raise InvalidInputError(f"replica {rs.replica_id}: unknown device {d!r}", culprit=d)
        config = configs[rs.model]
        tp = len(rs.device_ids)
        link = self.spec.link(rs.device_ids[0], rs.device_ids[1]) if tp > 1 else None
        if tp > 1 and link is None:
            raise InvalidInputError(f"replica {rs.replica_id}: no link between its devices", culprit=rs.replica_id)
        r = _Replica()
        r.spec, r.config, r.device_ids, r.tp = rs, config, rs.device_ids, tp
        r.table = IterationCostTable(config, self.cost_model, self._devices[rs.device_ids[0]],
                                     tp_degree=tp, link=link,
                                     overhead=self.overheads.get(rs.model, NO_OVERHEAD))
        r.kv_bytes_per_token = kv_bytes_per_token(config) / tp
        r.act_bytes_per_token = activation_bytes_per_token(config) / tp
        r.waiting = deque() if self._fifo or self.queue_policy is None else RequestQueue(self.queue_policy)
        r.prefilling, r.finishing, r.current = deque(), {}, []
        r.decoding_by_tenant = {}
        r.num_decodes = r.decode_context_sum = r.iteration = r.kv_tokens = 0
        r.busy = r.step_pending = False
        r.tokens_out = 0
        r.ends = np.zeros(1024)
        r.current_start_s = 0.0
        per_device_weights = -(-weight_bytes(config) // tp)
        r.kv_allocs, r.act_allocs = [], []
        for d in rs.device_ids:
            got = self.ledger.allocate(d, "weights", f"{rs.replica_id}/weights", per_device_weights)
            if got is None:
                raise InvalidInputError(
                    f"replica {rs.replica_id}: {per_device_weights} weight bytes do not fit on {d}", culprit=d)
            kv = self.ledger.allocate(d, "kv_cache", f"{rs.replica_id}/kv", 0)
            assert kv is not None
            r.kv_allocs.append(kv)
            self._by_device[d].append(rs.replica_id)
        self._replicas[rs.replica_id] = r
        # Devices hosting more than one replica: freeing KV on them must wake the others.
        self._shared = any(len(v) > 1 for v in self._by_device.values())
        self._by_model.setdefault(rs.model, []).append(rs.replica_id)

    def _wire(self) -> None:
        e = self.engine
        e.on(RequestArrived, self._on_request_arrived)
        e.on(StepRequested, self._on_step_requested)
        e.on(IterationFinished, self._on_iteration_finished)
        e.on(SliceFinished, self._on_slice_finished)
        e.on(TransferFinished, self._on_transfer_finished)

    # ---- public surface -----------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.engine.now_s

    @property
    def replica_ids(self) -> list[str]:
        return list(self._replicas)

    def replica_spec(self, replica_id: str) -> ReplicaSpec:
        return self._replicas[replica_id].spec

    def cost_table(self, replica_id: str) -> IterationCostTable:
        """The replica's memoised iteration-cost table (lookup and miss counters included)."""
        return self._replicas[replica_id].table

    def replica_load(self, replica_id: str) -> int:
        """Requests routed to the replica and not finished (waiting, prefilling, decoding)."""
        r = self._replicas[replica_id]
        return len(r.waiting) + len(r.prefilling) + r.num_decodes

    def device_free_at_s(self, device_id: str) -> float:
        """End of the work committed on the device so far, placed-slice reservations included."""
        res = self._reserved[device_id]
        return max(self._free_at[device_id], res[-1][1] if res else 0.0)

    def reservations(self, device_id: str) -> list[tuple[float, float, str]]:
        """Future windows ``(start_s, end_s, slice_id)`` of placed slices on the device."""
        return list(self._reserved[device_id])

    @property
    def served_tokens(self) -> dict[str, float]:
        """Tokens served per tenant so far (prompt plus output); kept for fair-share policies only."""
        return dict(self._served)

    def submit(self, requests: Workload | Iterable[RequestSpec]) -> None:
        """Schedule the arrivals (each at its ``arrival_s``, which must not be in the past)."""
        reqs = requests.requests if isinstance(requests, Workload) else requests
        for req in reqs:
            self.engine.schedule(RequestArrived(time_s=req.arrival_s, request=req))

    def run(self, until: float | None = None) -> None:
        self.engine.run(until)

    def report(self) -> SimReport:
        peaks = {d: self.ledger.peak_bytes(d) for d in self._devices}
        return self.metrics.report(makespan_s=self.engine.now_s, num_events=self.engine.num_handled,
                                   peak_mem_bytes=peaks, violations=self.ledger.violations)

    def slice_duration_s(self, ops: Sequence[OpFeatures], device_id: str) -> float:
        return self.cost_model.predict(ops, self._devices[device_id]).p50_s

    def commit(self, slice_spec: SliceSpec, placement: Placement) -> SliceTiming:
        """Place a slice now: move its inputs (FIFO on the link), hold its memory (forced:
        a violation is recorded if it does not fit) and reserve its device window."""
        now = self.engine.now_s
        dev = placement.device_id
        if slice_spec.slice_id in self._slice_timings:
            raise InvalidInputError(f"slice {slice_spec.slice_id!r} already placed", culprit=slice_spec.slice_id)
        if dev not in self._devices:
            raise InvalidInputError(f"unknown device {dev!r}", culprit=dev)
        allocs = [self.ledger.overflow(dev, "activation", slice_spec.slice_id, slice_spec.resident_bytes, at_s=now)]
        ready = now
        if slice_spec.input_bytes and slice_spec.input_device_id not in (None, dev):
            assert slice_spec.input_device_id is not None
            tt = self.transfer(slice_spec.input_device_id, dev, slice_spec.input_bytes)
            ready = tt.arrival_s
            allocs.append(self._transfer_buffers.pop(tt.transfer_id))
        duration = self.slice_duration_s(slice_spec.ops, dev)
        start = self._earliest_window([dev], max(placement.start_s, ready, now), duration)
        timing = SliceTiming(slice_spec.slice_id, dev, ready, start, start + duration)
        self._reserved[dev].append((start, start + duration, slice_spec.slice_id))
        self._reserved[dev].sort()
        self._slices[slice_spec.slice_id] = _PlacedSlice(slice_spec, timing, allocs)
        self._slice_timings[slice_spec.slice_id] = timing
        self.engine.schedule(SliceFinished(time_s=timing.finish_s, slice_id=slice_spec.slice_id))
        return timing

    def transfer(self, src: str, dst: str, size_bytes: int) -> TransferTiming:
        """Send ``size_bytes`` from ``src`` to ``dst`` now (FIFO on the directed link); the
        destination holds a transfer buffer until the consumer frees it."""
        link = self.spec.link(src, dst)
        if link is None:
            raise InvalidInputError(f"no link from {src} to {dst}", culprit=f"{src}->{dst}")
        now = self.engine.now_s
        start = max(now, self._link_free_at.get((src, dst), 0.0))
        wire_s = size_bytes / link.bytes_per_s
        self._link_free_at[(src, dst)] = start + wire_s
        tid = self._next_transfer_id
        self._next_transfer_id += 1
        timing = TransferTiming(tid, src, dst, size_bytes, start, start + wire_s + link.latency_us * 1e-6)
        self._transfers[tid] = timing
        self._transfer_buffers[tid] = self.ledger.overflow(dst, "transfer_buffer", f"transfer/{tid}",
                                                           size_bytes, at_s=now)
        self.engine.schedule(TransferFinished(time_s=timing.arrival_s, transfer_id=tid))
        return timing

    def transfer_timing(self, transfer_id: int) -> TransferTiming:
        return self._transfers[transfer_id]

    def slice_timing(self, slice_id: str) -> SliceTiming:
        return self._slice_timings[slice_id]

    # ---- handlers -----------------------------------------------------------------------
    def _on_request_arrived(self, ev: RequestArrived) -> list[Event]:
        req = ev.request
        self._arrived.append(req)
        candidates = self._routable(req)
        if candidates and not self._fits_ever(req, candidates):
            candidates = []
        if not candidates:
            self._notify_finished(self._dropped(req))
            return []
        rid = self._route(req, candidates)
        r = self._replicas[rid]
        if isinstance(r.waiting, deque) and self.estimator is None:
            r.waiting.append(_Live(req))
        else:
            self._enqueue(r, req)
        if r.busy or r.step_pending:
            return []
        r.step_pending = True
        return [StepRequested(time_s=ev.time_s, replica_id=rid)]

    def _enqueue(self, r: _Replica, req: RequestSpec) -> None:
        policy = self.queue_policy
        truth = policy is not None and policy.needs_truth
        # without an estimator only an oracle gets a budget: the true length
        estimate = (self.estimator.estimate(req) if self.estimator is not None
                    else req.output_tokens if truth else 0)
        live = _Live(req, estimate)
        if isinstance(r.waiting, deque):
            r.waiting.append(live)
            return
        q = QueuedRequest(req.request_id, req.tenant_id, req.model, req.arrival_s, req.prompt_tokens, estimate,
                          0, self.tenant_priority.get(req.tenant_id, 0), self.tenant_weight.get(req.tenant_id, 1.0),
                          req.output_tokens if truth else None)
        r.waiting.push(q, live)

    def _on_step_requested(self, ev: StepRequested) -> list[Event]:
        r = self._replicas.get(ev.replica_id)
        if r is None:  # removed after draining
            return []
        if self._ready_at.get(ev.replica_id, 0.0) == ev.time_s and r.spec.guest and not r.waiting:
            self._steal_waiting(r)
        r.step_pending = False
        if r.busy:
            return []
        return self._start_iteration(r, ev.time_s)

    def _on_iteration_finished(self, ev: IterationFinished) -> list[Event]:
        now = ev.time_s
        r = self._replicas[ev.replica_id]
        j = r.iteration
        ledger = self.ledger
        for a in r.act_allocs:
            ledger.free(a)
        r.act_allocs = []
        for d in r.device_ids:
            for obs in self._observers:
                obs.slice_executed(d, r.current_start_s, now, r.spec.replica_id)
        if j >= len(r.ends):
            r.ends = np.concatenate([r.ends, np.zeros(len(r.ends))])
        r.ends[j] = now
        # Every running decode produced one token; its next step sees one more cached token.
        # KV for a request's whole output is reserved at admission (its max_tokens): decodes grow
        # into the reservation, so nothing grows here and completions release all of it.
        kv_delta = 0
        r.tokens_out += r.num_decodes
        self.tokens_out += r.num_decodes
        r.decode_context_sum += r.num_decodes
        track = self._track_served
        if track:
            served = self._served
            for t, n in r.decoding_by_tenant.items():
                served[t] = served.get(t, 0.0) + n
        for live in r.finishing.pop(j, ()):
            spec = live.spec
            r.num_decodes -= 1
            r.decode_context_sum -= spec.prompt_tokens + spec.output_tokens - 1
            kv_delta -= spec.prompt_tokens + spec.output_tokens
            if track:
                r.decoding_by_tenant[spec.tenant_id] -= 1
            self._finished(r, live, now)
        prefilling = r.prefilling
        for live, n in r.current:
            live.prefilled += n
            if live.prefilled < live.spec.prompt_tokens:
                continue
            prefilling.popleft()  # completed prompts form a prefix of the admission order
            live.first_token_s = now
            r.tokens_out += 1
            self.tokens_out += 1
            live.first_iter = j
            spec = live.spec
            if track:
                self._served[spec.tenant_id] = self._served.get(spec.tenant_id, 0.0) + 1
            if spec.output_tokens == 1:
                kv_delta -= spec.prompt_tokens + spec.output_tokens
                self._finished(r, live, now)
            else:
                if track:
                    r.decoding_by_tenant[spec.tenant_id] = r.decoding_by_tenant.get(spec.tenant_id, 0) + 1
                r.num_decodes += 1
                r.decode_context_sum += spec.prompt_tokens
                r.finishing.setdefault(j + spec.output_tokens - 1, []).append(live)
        r.current = []
        if kv_delta:
            self._resize_kv(r, r.kv_tokens + kv_delta, now, force=True)
        r.iteration = j + 1
        r.busy = False
        if self._dynamic:
            self._last_active_s[ev.replica_id] = now
            if ev.replica_id in self._draining and self.replica_load(ev.replica_id) == 0:
                return self._remove_replica(ev.replica_id, now)
        follow = self._start_iteration(r, now)
        if kv_delta < 0 and self._shared:
            follow += self._wake_idle(r.device_ids, now)
        return follow

    def _on_slice_finished(self, ev: SliceFinished) -> list[Event]:
        placed = self._slices.pop(ev.slice_id)
        dev = placed.timing.device_id
        for a in placed.allocs:
            self.ledger.free(a)
        self._reserved[dev] = [x for x in self._reserved[dev] if x[2] != ev.slice_id]
        for obs in self._observers:
            obs.slice_executed(dev, placed.timing.start_s, placed.timing.finish_s, ev.slice_id)
        return self._wake_idle((dev,), ev.time_s)

    def _wake_idle(self, device_ids: Iterable[str], now: float) -> list[Event]:
        """Freed memory may let an idle replica on these devices admit its queue head."""
        out: list[Event] = []
        for dev in device_ids:
            for rid in self._by_device[dev]:
                r = self._replicas[rid]
                if r.waiting and not r.busy and not r.step_pending:
                    r.step_pending = True
                    out.append(StepRequested(time_s=now, replica_id=rid))
        return out

    def _on_transfer_finished(self, ev: TransferFinished) -> list[Event]:
        # A transfer alone (not feeding a slice) releases its buffer on arrival.
        buf = self._transfer_buffers.pop(ev.transfer_id, None)
        if buf is not None:
            self.ledger.free(buf)
        return []

    # ---- batching -----------------------------------------------------------------------
    def _start_iteration(self, r: _Replica, now: float) -> list[Event]:
        budget = r.spec.max_batched_tokens - r.num_decodes
        chunks: list[tuple[_Live, int]] = []
        p = pairs = kv_p = 0
        for live in r.prefilling:
            if budget <= 0:
                break
            cached = live.prefilled
            n = min(budget, live.spec.prompt_tokens - cached)
            chunks.append((live, n))
            budget -= n
            p += n
            pairs += n * (cached + n)
            kv_p += cached + n
        num_seqs = len(r.prefilling) + r.num_decodes
        waiting = r.waiting
        served = self._served
        while budget > 0 and waiting and num_seqs < r.spec.max_num_seqs:
            live = waiting[0] if isinstance(waiting, deque) else waiting.peek(served)
            prompt = live.spec.prompt_tokens
            reserve = prompt + live.spec.output_tokens
            if not self._resize_kv(r, r.kv_tokens + reserve, now, force=False, watermark=True):
                break  # head-of-line: the selected request waits, nothing overtakes it
            if isinstance(waiting, deque):
                waiting.popleft()
            else:
                waiting.pop(served)
            if self._track_served:
                served[live.spec.tenant_id] = served.get(live.spec.tenant_id, 0.0) + prompt
            live.admitted_s = now
            r.prefilling.append(live)
            num_seqs += 1
            n = min(budget, prompt)
            chunks.append((live, n))
            budget -= n
            p += n
            pairs += n * n
            kv_p += n
        if not chunks and not r.num_decodes:
            return []
        duration = r.table.latency_s(p, pairs, kv_p, len(chunks), r.num_decodes, r.decode_context_sum)
        start = self._earliest_window(r.device_ids, now, duration)
        end = start + duration
        act = int((p + r.num_decodes) * r.act_bytes_per_token)
        r.act_allocs = [self.ledger.overflow(d, "activation", r.spec.replica_id, act, at_s=now)
                        for d in r.device_ids]
        r.current = chunks
        r.current_start_s = start
        r.busy = True
        for d in r.device_ids:
            self._free_at[d] = end
        return [IterationFinished(time_s=end, replica_id=r.spec.replica_id, iteration=r.iteration)]

    def _earliest_window(self, device_ids: Sequence[str], t: float, duration: float) -> float:
        """Earliest start >= t at which every device is free for ``duration`` seconds."""
        for d in device_ids:
            if self._free_at[d] > t:
                t = self._free_at[d]
        moved = True
        while moved:
            moved = False
            for d in device_ids:
                for start, end, _ in self._reserved[d]:
                    if start < t + duration and t < end:
                        t = end
                        moved = True
        return t

    def _resize_kv(self, r: _Replica, tokens: int, now: float, *, force: bool,
                   watermark: bool = False) -> bool:
        """Set the replica's KV to ``tokens`` tokens on all its devices; False (unchanged) if
        it does not fit (under the watermark too, for admissions) and ``force`` is off."""
        size = math.ceil(tokens * r.kv_bytes_per_token)
        ledger = self.ledger
        if not force:
            for d, a in zip(r.device_ids, r.kv_allocs, strict=True):
                # Admission keeps room for the watermark and this iteration's activations.
                reserve = (int(self.kv_watermark_fraction * ledger.capacity_bytes(d))
                           + int(r.spec.max_batched_tokens * r.act_bytes_per_token)) if watermark else 0
                if size - a.size_bytes > ledger.free_bytes(d) - reserve:
                    return False
        r.kv_allocs = [ledger.resize(a, size, at_s=now, force=True) or a for a in r.kv_allocs]
        r.kv_tokens = tokens
        return True

    def _routable(self, req: RequestSpec) -> list[str]:
        """Replicas that may take ``req`` now: its model, its tenant (or any), ready, not draining."""
        ids = self._by_model.get(req.model, [])
        if not self._dynamic:
            return [rid for rid in ids if self._replicas[rid].spec.tenant_id in (None, req.tenant_id)]
        now = self.engine.now_s
        return [rid for rid in ids if self._replicas[rid].spec.tenant_id in (None, req.tenant_id)
                and rid not in self._draining and self._ready_at.get(rid, 0.0) <= now]

    def _fits_ever(self, req: RequestSpec, candidates: Sequence[str]) -> bool:
        """Could the whole request's KV fit on an otherwise empty replica of its model?"""
        for rid in candidates:
            r = self._replicas[rid]
            need = ((req.prompt_tokens + req.output_tokens) * r.kv_bytes_per_token
                    + r.spec.max_batched_tokens * r.act_bytes_per_token
                    + self.kv_watermark_fraction * self.ledger.capacity_bytes(r.device_ids[0]))
            if all(need <= self.ledger.limit_bytes(d) - self._weights_on(r, d) for d in r.device_ids):
                return True
        return False

    def _weights_on(self, r: _Replica, device_id: str) -> int:
        return -(-weight_bytes(r.config) // r.tp)

    def _route(self, req: RequestSpec, candidates: Sequence[str]) -> str:
        if len(candidates) == 1:
            return candidates[0]
        if self.router is not None:
            return self.router(req, candidates, self)
        loads = [self.replica_load(c) for c in candidates]
        least = min(loads)
        ties = [c for c, load in zip(candidates, loads, strict=True) if load == least]
        return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]

    # ---- outcomes -----------------------------------------------------------------------
    def _outcome(self, r: _Replica, live: _Live, now: float) -> RequestOutcome:
        spec = live.spec
        k, steps = live.first_iter, spec.output_tokens - 1
        if steps > 0:
            gaps = np.diff(r.ends[k:k + steps + 1])
            tbt_mean, tbt_max = float((r.ends[k + steps] - r.ends[k]) / steps), float(gaps.max())
        else:
            tbt_mean = tbt_max = 0.0
        ttft, e2e = live.first_token_s - spec.arrival_s, now - spec.arrival_s
        sla = self.sla_classes.get(spec.sla_class) or self.sla_classes["standard"]
        slack = sla.slack_s(ttft, tbt_mean, e2e)
        return RequestOutcome(spec.request_id, spec.tenant_id, spec.model, r.spec.replica_id, spec.sla_class,
                              spec.arrival_s, live.admitted_s, live.first_token_s, now, spec.output_tokens,
                              ttft, tbt_mean, tbt_max, e2e, slack, slack >= 0.0)

    def _dropped(self, req: RequestSpec) -> RequestOutcome:
        nan = math.nan
        return RequestOutcome(req.request_id, req.tenant_id, req.model, "", req.sla_class, req.arrival_s,
                              nan, nan, nan, 0, nan, nan, nan, nan, -math.inf, False, dropped=True)

    def _finished(self, r: _Replica, live: _Live, now: float) -> None:
        self._notify_finished(self._outcome(r, live, now))
        if self.estimator is not None:
            self.estimator.observe(live.spec, live.spec.output_tokens)

    def _notify_finished(self, outcome: RequestOutcome) -> None:
        for obs in self._observers:
            obs.request_finished(outcome)

    # ---- what-if support ----------------------------------------------------------------
    def affected(self, device_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """(devices, replicas) that work on ``device_ids`` can influence: the devices plus
        every device of a replica touching one of them, closed under that relation."""
        devices = set(device_ids)
        replicas: set[str] = set()
        grew = True
        while grew:
            grew = False
            for rid, r in self._replicas.items():
                if rid not in replicas and devices.intersection(r.device_ids):
                    replicas.add(rid)
                    devices.update(r.device_ids)
                    grew = True
        return devices, replicas

    def fork(self, device_ids: Iterable[str]) -> SimulatedCluster:
        """A copy of the part of the state that ``device_ids`` can influence, at the same time.

        The fork holds the affected replicas (with their queued and running requests), the
        placed slices and pending transfers touching affected devices, a copy of the ledger
        and the link states. Future arrivals are not carried: the fork predicts what happens
        to the work already in the system. The original is not changed.
        """
        devices, replicas = self.affected(device_ids)
        f = SimulatedCluster.__new__(SimulatedCluster)
        f.spec, f.cost_model, f.sla_classes = self.spec, self.cost_model, self.sla_classes
        f.rng = copy.deepcopy(self.rng)
        f.kv_watermark_fraction, f.router = self.kv_watermark_fraction, self.router
        f.queue_policy, f._fifo, f._track_served = self.queue_policy, self._fifo, self._track_served
        f.estimator = None  # a what-if must not calibrate the real estimator (no arrivals to estimate)
        f.tenant_priority, f.tenant_weight = self.tenant_priority, self.tenant_weight
        f._served = dict(self._served)
        f._devices = self._devices
        f.ledger = self.ledger.copy()
        f.ledger.reset_peaks(self.engine.now_s)
        f.metrics = MetricsCollector(list(self._devices))
        f._observers = [f.metrics]
        f._free_at = dict(self._free_at)
        f._reserved = {d: list(v) for d, v in self._reserved.items()}
        f._link_free_at = dict(self._link_free_at)
        f._slices = {k: _PlacedSlice(v.spec, v.timing, list(v.allocs)) for k, v in self._slices.items()
                     if v.timing.device_id in devices}
        f._slice_timings = dict(self._slice_timings)
        f._transfers = dict(self._transfers)
        f._next_transfer_id = self._next_transfer_id
        f._transfer_buffers = dict(self._transfer_buffers)
        f._replicas = {rid: r.clone() for rid, r in self._replicas.items() if rid in replicas}
        f._by_model = {m: [x for x in ids if x in replicas] for m, ids in self._by_model.items()}
        f._by_device = {d: [x for x in ids if x in replicas] for d, ids in self._by_device.items()}
        f._shared = self._shared
        f._configs, f._dynamic, f.overheads = self._configs, self._dynamic, self.overheads
        f._ready_at = dict(self._ready_at)
        f._draining = set(self._draining) & set(f._replicas)
        f._last_active_s = dict(self._last_active_s)
        f._arrived = []
        f.tokens_out = self.tokens_out

        def keep(ev: Event) -> bool:
            if isinstance(ev, (IterationFinished, StepRequested)):
                return ev.replica_id in replicas
            if isinstance(ev, SliceFinished):
                return ev.slice_id in f._slices
            if isinstance(ev, TransferFinished):
                return self._transfers[ev.transfer_id].dst in devices
            return False  # arrivals: the fork predicts the work already in the system

        f.engine = self.engine.fork(keep)
        f._wire()
        return f

    # ---- run-time replica changes -----------------------------------------------------------
    def add_replica(self, spec: ReplicaSpec, *, weights_from: str | None = None) -> float | None:
        """Create a replica now; returns the time it starts taking requests, or ``None`` when
        its weights do not fit (nothing changes then).

        With ``weights_from`` (a device holding the model's weights) each device's shard is
        copied over the link from there (FIFO on the link); the replica is ready when the last
        shard has arrived, and then takes over part of its tenant's queued requests.
        """
        self._dynamic = True
        try:
            self._add_replica(spec, self._configs)
        except InvalidInputError:
            return None
        now = self.engine.now_s
        ready = now
        if weights_from is not None:
            shard = -(-weight_bytes(self._configs[spec.model]) // len(spec.device_ids))
            for d in spec.device_ids:
                if d == weights_from:
                    continue
                tt = self.transfer(weights_from, d, shard)
                buf = self._transfer_buffers.pop(tt.transfer_id, None)
                if buf is not None:  # the weights allocation already holds these bytes
                    self.ledger.free(buf)
                ready = max(ready, tt.arrival_s)
        self._ready_at[spec.replica_id] = ready
        self._last_active_s[spec.replica_id] = ready
        r = self._replicas[spec.replica_id]
        r.step_pending = True
        self.engine.schedule(StepRequested(time_s=ready, replica_id=spec.replica_id))
        return ready

    def drain_replica(self, replica_id: str) -> None:
        """Stop routing to the replica; its queued requests move to the tenant's other
        replicas, and it is removed (memory freed) once its running requests finish."""
        if replica_id not in self._replicas:
            raise InvalidInputError(f"unknown replica {replica_id!r}", culprit=replica_id)
        self._dynamic = True
        self._draining.add(replica_id)
        r = self._replicas[replica_id]
        moved = self._take_waiting(r, len(r.waiting))
        for live in moved:
            others = self._routable(live.spec)
            if not others:
                self._push_waiting(r, live)  # nowhere else: it stays and is served before removal
                continue
            dest = self._replicas[self._route(live.spec, others)]
            self._push_waiting(dest, live)
            if not dest.busy and not dest.step_pending:
                dest.step_pending = True
                self.engine.schedule(StepRequested(time_s=self.engine.now_s, replica_id=dest.spec.replica_id))
        if self.replica_load(replica_id) == 0 and not r.busy:
            for ev in self._remove_replica(replica_id, self.engine.now_s):
                self.engine.schedule(ev)

    def replica_state(self, replica_id: str) -> tuple[int, int, bool, float]:
        """(waiting, running, draining, idle seconds) of a replica."""
        r = self._replicas[replica_id]
        running = len(r.prefilling) + r.num_decodes
        idle = 0.0
        if len(r.waiting) + running == 0:
            idle = max(0.0, self.engine.now_s - self._last_active_s.get(replica_id, 0.0))
        return len(r.waiting), running, replica_id in self._draining, idle

    def arrivals_since(self, since_s: float) -> list[RequestSpec]:
        """Requests that arrived at or after ``since_s`` (oldest first)."""
        i = len(self._arrived)
        while i > 0 and self._arrived[i - 1].arrival_s >= since_s:
            i -= 1
        return self._arrived[i:]

    def ready_at_s(self, replica_id: str) -> float:
        return self._ready_at.get(replica_id, 0.0)

    def _remove_replica(self, replica_id: str, now: float) -> list[Event]:
        r = self._replicas.pop(replica_id)
        for a in [*r.kv_allocs, *r.act_allocs]:
            self.ledger.free(a)
        for d in r.device_ids:
            weights = [a for a in self.ledger.allocations(d) if a.owner == f"{replica_id}/weights"]
            for a in weights:
                self.ledger.free(a)
            self._by_device[d].remove(replica_id)
        self._by_model[r.spec.model].remove(replica_id)
        self._draining.discard(replica_id)
        self._shared = any(len(v) > 1 for v in self._by_device.values())
        return self._wake_idle(r.device_ids, now)

    def _take_waiting(self, r: _Replica, n: int) -> list[_Live]:
        out: list[_Live] = []
        while r.waiting and len(out) < n:
            out.append(r.waiting.pop() if isinstance(r.waiting, deque) else r.waiting.pop(self._served))
        return out

    def _push_waiting(self, r: _Replica, live: _Live) -> None:
        if isinstance(r.waiting, deque):
            r.waiting.append(live)
            return
        spec = live.spec
        truth = self.queue_policy is not None and self.queue_policy.needs_truth
        q = QueuedRequest(spec.request_id, spec.tenant_id, spec.model, spec.arrival_s, spec.prompt_tokens,
                          live.estimate, 0, self.tenant_priority.get(spec.tenant_id, 0),
                          self.tenant_weight.get(spec.tenant_id, 1.0), spec.output_tokens if truth else None)
        r.waiting.push(q, live)

    def _steal_waiting(self, r: _Replica) -> None:
        """A new replica takes an even share of its tenant's queued requests."""
        tenant = r.spec.tenant_id
        peers = [self._replicas[x] for x in self._by_model.get(r.spec.model, [])
                 if x != r.spec.replica_id and self._replicas[x].spec.tenant_id == tenant]
        target = sum(len(p.waiting) for p in peers) // (len(peers) + 1)  # each replica's fair share
        share = target
        for p in sorted(peers, key=lambda p: -len(p.waiting)):
            take = min(share, max(0, len(p.waiting) - target))
            for live in reversed(self._take_waiting(p, take)):
                self._push_waiting(r, live)
            share -= take

    def in_flight(self) -> list[tuple[str, RequestSpec]]:
        """(replica_id, request) of every request routed to a replica and not finished."""
        out: list[tuple[str, RequestSpec]] = []
        for rid, r in self._replicas.items():
            seen: set[str] = set()
            for group in (r.prefilling, r.waiting, *r.finishing.values()):
                for live in group:
                    if live.spec.request_id not in seen:
                        seen.add(live.spec.request_id)
                        out.append((rid, live.spec))
        return out

    def kv_tokens(self, replica_id: str) -> int:
        """KV tokens the replica holds now (for tests and the scheduler's view)."""
        return self._replicas[replica_id].kv_tokens
