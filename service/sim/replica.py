"""A replica under simulation: continuous batching with KV admission.

A replica is a model on one or more devices (tensor parallel: compute divided by the number of
devices plus two ring all-reduces per layer over their link, see
:class:`~service.sim.iteration.IterationCostTable`). Each iteration batches every running
decode (one token each) and then prompt chunks (chunked prefill) up to ``max_batched_tokens``:
first the partially prefilled requests in admission order, then waiting requests in the queue
policy's order. A waiting request is admitted when its prompt's KV (plus one token) fits under
the device limit minus a watermark; if the head of the queue does not fit, admission stops (no
overtaking of the selected request, no preemption); admission also keeps room for the
activations of a full iteration (``max_batched_tokens`` tokens). The iteration that finishes a
prompt emits its first token; every later iteration emits one more. Iterations of a busy
replica run back to back; one event per iteration per replica, never per token.

Memory: KV of a replica is one allocation per device (``kv_cache``, owner ``<replica>/kv``): a
request is admitted only when its prompt plus its whole output (the ``max_tokens`` it declares;
the traces' output lengths stand for it) fits, so decoding never outgrows memory and no
preemption is needed; released at completion. Live activations of an iteration are allocated
for its duration (forced: an overflow is recorded as a violation, never absorbed).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from service.core.batching import SIM_BATCHING
from service.core.cost import CostModel, IterationOverhead
from service.core.memory import Allocation, MemoryLedger
from service.core.queue import WaitingQueue
from service.domain.cluster import ClusterSpec, Device
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.models.family import ModelConfig
from service.sim.engine import IterationFinished
from service.sim.iteration import IterationCostTable, activation_bytes_per_token, kv_bytes_per_token, weight_bytes
from service.sim.report import RequestOutcome
from service.sim.resource import DeviceTimelines
from service.sim.sla import SlaClass

__all__ = ["Batcher", "Live", "OutputEstimator", "Replica", "ReplicaSpec", "build_replica", "dropped_outcome",
           "request_outcome"]


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    replica_id: str
    model: str  # a name in MODEL_CONFIGS
    device_ids: tuple[str, ...]  # one device, or several for tensor parallelism
    max_batched_tokens: int = SIM_BATCHING.max_batched_tokens  # token budget of one iteration (a decode counts one)
    max_num_seqs: int = SIM_BATCHING.max_num_seqs  # admitted sequences at most (prefilling plus decoding)
    tenant_id: str | None = None  # serves only this tenant's requests (None: any tenant of the model)
    guest: bool = False  # added at run time outside the tenant's home devices


class OutputEstimator(Protocol):
    """What the cluster needs of an output-length estimator (see ``learned.estimator``)."""

    def estimate(self, req: RequestSpec) -> int: ...

    def observe(self, req: RequestSpec, true_output_tokens: int) -> None: ...


class Live:
    """Mutable state of one request inside a replica."""

    __slots__ = ("admitted_s", "estimate", "first_iter", "first_token_s", "prefilled", "spec")

    def __init__(self, spec: RequestSpec, estimate: int = 0) -> None:
        self.spec = spec
        self.estimate = estimate  # output-token budget given at arrival (0: none)
        self.prefilled = 0
        self.admitted_s = math.nan
        self.first_token_s = math.nan
        self.first_iter = -1


@dataclass(slots=True, eq=False)
class Replica:
    """Mutable state of one replica (the simulator owns all of it)."""

    spec: ReplicaSpec
    config: ModelConfig
    table: IterationCostTable
    kv_bytes_per_token: float
    act_bytes_per_token: float
    waiting: WaitingQueue[Live]
    kv_allocs: list[Allocation]  # one per device
    act_allocs: list[Allocation]  # this iteration's activations, one per device
    prefilling: deque[Live]  # admitted, prompt not finished, in admission order
    finishing: dict[int, list[Live]]  # iteration index -> requests whose last token it produces
    current: list[tuple[Live, int]]  # this iteration's prefill chunks
    decoding_by_tenant: dict[str, int]  # kept for fair-share policies only
    ends: np.ndarray  # end time of every iteration so far, by iteration index
    num_decodes: int = 0
    decode_context_sum: int = 0
    iteration: int = 0
    kv_tokens: int = 0
    tokens_out: int = 0
    busy: bool = False
    step_pending: bool = False
    current_start_s: float = 0.0

    @property
    def device_ids(self) -> tuple[str, ...]:
        return self.spec.device_ids

    @property
    def tp(self) -> int:
        return len(self.spec.device_ids)

    def load(self) -> int:
        """Requests routed here and not finished (waiting, prefilling, decoding)."""
        return len(self.waiting) + len(self.prefilling) + self.num_decodes

    def clone(self) -> Replica:
        """An independent copy: every container copied, each request copied once."""
        lives: dict[int, Live] = {}

        def c(x: Live) -> Live:
            got = lives.get(id(x))
            if got is None:
                got = lives[id(x)] = copy.copy(x)
            return got

        other = Replica(**{f.name: getattr(self, f.name) for f in fields(self)})
        other.waiting = self.waiting.copy(c)
        other.decoding_by_tenant = dict(self.decoding_by_tenant)
        other.prefilling = deque(c(x) for x in self.prefilling)
        other.finishing = {k: [c(x) for x in v] for k, v in self.finishing.items()}
        other.current = [(c(x), n) for x, n in self.current]
        other.ends = self.ends.copy()
        other.kv_allocs = list(self.kv_allocs)
        other.act_allocs = list(self.act_allocs)
        return other


def build_replica(rs: ReplicaSpec, *, cluster: ClusterSpec, devices: Mapping[str, Device],
                  configs: Mapping[str, ModelConfig], cost_model: CostModel,
                  overheads: Mapping[str, IterationOverhead], ledger: MemoryLedger,
                  waiting: WaitingQueue[Live]) -> Replica:
    """Validate ``rs`` and allocate its weights (and an empty KV allocation) on its devices;
    ``InvalidInputError`` (nothing allocated for a failed check) if it cannot exist."""
    if rs.model not in configs:
        raise InvalidInputError(f"replica {rs.replica_id}: unknown model {rs.model!r}", culprit=rs.model)
    if not rs.device_ids or len(set(rs.device_ids)) != len(rs.device_ids):
        raise InvalidInputError(f"replica {rs.replica_id}: needs distinct device ids", culprit=rs.replica_id)
    for d in rs.device_ids:
        if d not in devices:
            raise InvalidInputError(f"replica {rs.replica_id}: unknown device {d!r}", culprit=d)
    config = configs[rs.model]
    tp = len(rs.device_ids)
    link = cluster.link(rs.device_ids[0], rs.device_ids[1]) if tp > 1 else None
    if tp > 1 and link is None:
        raise InvalidInputError(f"replica {rs.replica_id}: no link between its devices", culprit=rs.replica_id)
    table = IterationCostTable(config, cost_model, devices[rs.device_ids[0]], tp_degree=tp, link=link,
                               overhead=overheads.get(rs.model))
    per_device_weights = -(-weight_bytes(config) // tp)
    kv_allocs = []
    for d in rs.device_ids:
        got = ledger.allocate(d, "weights", f"{rs.replica_id}/weights", per_device_weights)
        if got is None:
            raise InvalidInputError(
                f"replica {rs.replica_id}: {per_device_weights} weight bytes do not fit on {d}", culprit=d)
        kv = ledger.allocate(d, "kv_cache", f"{rs.replica_id}/kv", 0)
        if kv is None:  # an empty allocation always fits
            raise InvalidInputError(f"replica {rs.replica_id}: no KV allocation on {d}", culprit=d)
        kv_allocs.append(kv)
    return Replica(spec=rs, config=config, table=table, kv_bytes_per_token=kv_bytes_per_token(config) / tp,
                   act_bytes_per_token=activation_bytes_per_token(config) / tp, waiting=waiting,
                   kv_allocs=kv_allocs, act_allocs=[], prefilling=deque(), finishing={}, current=[],
                   decoding_by_tenant={}, ends=np.zeros(1024))


class Batcher:
    """Continuous batching and KV admission of the replicas sharing one ledger and one set of
    device timelines. ``served`` (tokens per tenant) is counted only when ``track_served``."""

    __slots__ = ("kv_watermark_fraction", "ledger", "served", "timelines", "track_served")

    def __init__(self, ledger: MemoryLedger, timelines: DeviceTimelines, served: dict[str, float], *,
                 track_served: bool, kv_watermark_fraction: float) -> None:
        self.ledger = ledger
        self.timelines = timelines
        self.served = served
        self.track_served = track_served
        self.kv_watermark_fraction = kv_watermark_fraction

    def start_iteration(self, r: Replica, now: float) -> IterationFinished | None:
        """Admit what fits and start the replica's next iteration; ``None`` when it has no work."""
        budget = r.spec.max_batched_tokens - r.num_decodes
        chunks: list[tuple[Live, int]] = []
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
        served = self.served
        while budget > 0 and waiting and num_seqs < r.spec.max_num_seqs:
            live = waiting.peek(served)
            prompt = live.spec.prompt_tokens
            reserve = prompt + live.spec.output_tokens
            if not self.resize_kv(r, r.kv_tokens + reserve, now, force=False, watermark=True):
                break  # head-of-line: the selected request waits, nothing overtakes it
            waiting.pop(served)
            if self.track_served:
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
            return None
        duration = r.table.latency_s(p, pairs, kv_p, len(chunks), r.num_decodes, r.decode_context_sum)
        start = self.timelines.earliest_window(r.device_ids, now, duration)
        end = start + duration
        act = int((p + r.num_decodes) * r.act_bytes_per_token)
        r.act_allocs = [self.ledger.overflow(d, "activation", r.spec.replica_id, act, at_s=now)
                        for d in r.device_ids]
        r.current = chunks
        r.current_start_s = start
        r.busy = True
        self.timelines.occupy(r.device_ids, end)
        return IterationFinished(time_s=end, replica_id=r.spec.replica_id, iteration=r.iteration)

    def finish_iteration(self, r: Replica, now: float) -> tuple[list[Live], int, int]:
        """Account the iteration that ends at ``now``: ``(finished requests in order, KV token
        change, output tokens produced)``. The replica is idle afterwards."""
        j = r.iteration
        ledger = self.ledger
        for a in r.act_allocs:
            ledger.free(a)
        r.act_allocs = []
        if j >= len(r.ends):
            r.ends = np.concatenate([r.ends, np.zeros(len(r.ends))])
        r.ends[j] = now
        # Every running decode produced one token; its next step sees one more cached token.
        # KV for a request's whole output is reserved at admission (its max_tokens): decodes grow
        # into the reservation, so nothing grows here and completions release all of it.
        kv_delta = 0
        tokens = r.num_decodes
        r.decode_context_sum += r.num_decodes
        finished: list[Live] = []
        track = self.track_served
        served = self.served
        if track:
            for t, n in r.decoding_by_tenant.items():
                served[t] = served.get(t, 0.0) + n
        for live in r.finishing.pop(j, ()):
            spec = live.spec
            r.num_decodes -= 1
            r.decode_context_sum -= spec.prompt_tokens + spec.output_tokens - 1
            kv_delta -= spec.prompt_tokens + spec.output_tokens
            if track:
                r.decoding_by_tenant[spec.tenant_id] -= 1
            finished.append(live)
        prefilling = r.prefilling
        for live, n in r.current:
            live.prefilled += n
            if live.prefilled < live.spec.prompt_tokens:
                continue
            prefilling.popleft()  # completed prompts form a prefix of the admission order
            live.first_token_s = now
            tokens += 1
            live.first_iter = j
            spec = live.spec
            if track:
                served[spec.tenant_id] = served.get(spec.tenant_id, 0.0) + 1
            if spec.output_tokens == 1:
                kv_delta -= spec.prompt_tokens + spec.output_tokens
                finished.append(live)
            else:
                if track:
                    r.decoding_by_tenant[spec.tenant_id] = r.decoding_by_tenant.get(spec.tenant_id, 0) + 1
                r.num_decodes += 1
                r.decode_context_sum += spec.prompt_tokens
                r.finishing.setdefault(j + spec.output_tokens - 1, []).append(live)
        r.tokens_out += tokens
        r.current = []
        if kv_delta:
            self.resize_kv(r, r.kv_tokens + kv_delta, now, force=True)
        r.iteration = j + 1
        r.busy = False
        return finished, kv_delta, tokens

    def resize_kv(self, r: Replica, tokens: int, now: float, *, force: bool, watermark: bool = False) -> bool:
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

    def fits_ever(self, req: RequestSpec, r: Replica) -> bool:
        """Could the whole request's KV fit on an otherwise empty replica like ``r``?"""
        need = ((req.prompt_tokens + req.output_tokens) * r.kv_bytes_per_token
                + r.spec.max_batched_tokens * r.act_bytes_per_token
                + self.kv_watermark_fraction * self.ledger.capacity_bytes(r.device_ids[0]))
        weights = -(-weight_bytes(r.config) // r.tp)
        return all(need <= self.ledger.limit_bytes(d) - weights for d in r.device_ids)


def request_outcome(r: Replica, live: Live, now: float, sla_classes: Mapping[str, SlaClass]) -> RequestOutcome:
    """The outcome of a request that finished on ``r`` at ``now``."""
    spec = live.spec
    k, steps = live.first_iter, spec.output_tokens - 1
    if steps > 0:
        gaps = np.diff(r.ends[k:k + steps + 1])
        tbt_mean, tbt_max = float((r.ends[k + steps] - r.ends[k]) / steps), float(gaps.max())
    else:
        tbt_mean = tbt_max = 0.0
    ttft, e2e = live.first_token_s - spec.arrival_s, now - spec.arrival_s
    sla = sla_classes.get(spec.sla_class) or sla_classes["standard"]
    slack = sla.slack_s(ttft, tbt_mean, e2e)
    return RequestOutcome(spec.request_id, spec.tenant_id, spec.model, r.spec.replica_id, spec.sla_class,
                          spec.arrival_s, live.admitted_s, live.first_token_s, now, spec.output_tokens,
                          ttft, tbt_mean, tbt_max, e2e, slack, slack >= 0.0)


def dropped_outcome(req: RequestSpec) -> RequestOutcome:
    """The outcome of a request no replica can ever take."""
    nan = math.nan
    return RequestOutcome(req.request_id, req.tenant_id, req.model, "", req.sla_class, req.arrival_s,
                          nan, nan, nan, 0, nan, nan, nan, nan, -math.inf, False, dropped=True)
