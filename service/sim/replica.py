"""A replica under simulation: continuous batching with KV admission and preemption.

A replica is a model on one or more devices (tensor parallel: compute divided by the number of
devices plus two ring all-reduces per layer over their link, see
:class:`~service.sim.iteration.IterationCostTable`). Each iteration batches every running
decode (one token each) and then prompt chunks (chunked prefill) up to ``max_batched_tokens``:
first the partially prefilled requests in admission order, then preempted requests, then
waiting requests in the queue policy's order (:func:`service.core.admission.admit`,
head-of-line: if the selected request does not fit, nothing overtakes it). The iteration that
finishes a prompt emits its first token; every later iteration emits one more. Iterations of a
busy replica run back to back; one event per iteration per replica, never per token.

Memory: KV of a replica is one allocation per device (``kv_cache``, owner ``<replica>/kv``).
``paged`` (default, as vLLM): a request is admitted when its prompt plus one block of rounding
fits under the device limit minus a watermark and a full iteration's activations; its KV grows
by a token per decode; when growth does not fit, the newest running requests are preempted
(recompute: their KV is dropped, they are readmitted before the queue and prefill their prompt
plus what they had generated again, charged as prefill work). ``reserve``: a request is
admitted only when its prompt plus its whole output fits, so decoding never outgrows memory.
KV is released at completion. Live activations of an iteration are allocated for its duration
(forced: an overflow is recorded as a violation, never absorbed).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Protocol

import numpy as np

from service.core.admission import admit
from service.core.batching import SIM_BATCHING
from service.core.cost import CostModel, IterationOverhead
from service.core.memory import Allocation, MemoryLedger
from service.core.queue import FifoQueue, QueuedRequest, WaitingQueue
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
    prefill_first: bool = SIM_BATCHING.prefill_first  # whole-prompt prefill iterations, decodes paused (vLLM v0)
    tenant_id: str | None = None  # serves only this tenant's requests (None: any tenant of the model)
    guest: bool = False  # added at run time outside the tenant's home devices


class OutputEstimator(Protocol):
    """What the cluster needs of an output-length estimator (see ``learned.estimator``)."""

    def estimate(self, req: RequestSpec) -> int: ...

    def observe(self, req: RequestSpec, true_output_tokens: int) -> None: ...


class Live:
    """Mutable state of one request inside a replica."""

    __slots__ = ("admitted_s", "decode_iter", "estimate", "first_iter", "first_token_s", "generated", "kv_base",
                 "max_gap_s", "preempted_s", "prefilled", "run_start_s", "spec")

    def __init__(self, spec: RequestSpec, estimate: int = 0) -> None:
        self.spec = spec
        self.estimate = estimate  # output-token budget given at arrival (0: none)
        self.prefilled = 0  # tokens of the prefill target in KV
        self.admitted_s = math.nan  # first admission
        self.first_token_s = math.nan
        self.first_iter = -1  # iteration of the first token
        self.generated = 0  # output tokens produced before the current decode run (recompute after preemption)
        self.decode_iter = -1  # iteration whose prefill started the current decode run
        self.kv_base = 0  # KV tokens held when the current decode run started (paged: target + one block)
        self.max_gap_s = 0.0  # longest gap between two tokens in earlier decode runs (preemption stalls)
        self.preempted_s = math.nan  # when its last token before a preemption was produced
        self.run_start_s = math.nan  # when the current decode run's first token came

    @property
    def target(self) -> int:
        """Tokens to prefill: the prompt, plus what it had generated when preempted (recompute)."""
        return self.spec.prompt_tokens + self.generated


@dataclass(slots=True, eq=False)
class Replica:
    """Mutable state of one replica (the simulator owns all of it)."""

    spec: ReplicaSpec
    config: ModelConfig
    table: IterationCostTable
    kv_bytes_per_token: float
    act_bytes_per_token: float
    waiting: WaitingQueue[Live]
    preempted: FifoQueue[Live]  # preempted requests, readmitted before the waiting queue
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
    decodes_paused: bool = False  # this iteration prefills only (prefill_first): running decodes wait
    run_starts: list[tuple[float, int]] = field(default_factory=list)  # decode runs begun since the last step: (time, n)
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
        return len(self.waiting) + len(self.preempted) + len(self.prefilling) + self.num_decodes

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
        other.preempted = self.preempted.copy(c)
        other.decoding_by_tenant = dict(self.decoding_by_tenant)
        other.prefilling = deque(c(x) for x in self.prefilling)
        other.finishing = {k: [c(x) for x in v] for k, v in self.finishing.items()}
        other.current = [(c(x), n) for x, n in self.current]
        other.ends = self.ends.copy()
        other.kv_allocs = list(self.kv_allocs)
        other.act_allocs = list(self.act_allocs)
        other.run_starts = list(self.run_starts)
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
                   act_bytes_per_token=activation_bytes_per_token(config) / tp, waiting=waiting, preempted=FifoQueue(),
                   kv_allocs=kv_allocs, act_allocs=[], prefilling=deque(), finishing={}, current=[],
                   decoding_by_tenant={}, ends=np.zeros(1024))


_UNKEYED = QueuedRequest("", "", "", 0.0, 0, 0)  # a FifoQueue ignores keys


class Batcher:
    """Continuous batching and KV admission of the replicas sharing one ledger and one set of
    device timelines. ``served`` (tokens per tenant) is counted only when ``track_served``.
    ``paged``: KV grows with the tokens (``block_tokens`` of rounding per sequence) and the
    newest request is preempted (recompute) when it cannot grow; else the whole request is
    reserved at admission."""

    __slots__ = ("block_tokens", "kv_watermark_fraction", "ledger", "paged", "preemptions", "recomputed_tokens",
                 "served", "timelines", "token_gaps", "track_served")

    def __init__(self, ledger: MemoryLedger, timelines: DeviceTimelines, served: dict[str, float], *,
                 track_served: bool, kv_watermark_fraction: float, paged: bool = False,
                 block_tokens: int = 16, record_token_gaps: bool = False) -> None:
        self.ledger = ledger
        self.timelines = timelines
        self.served = served
        self.track_served = track_served
        self.kv_watermark_fraction = kv_watermark_fraction
        self.paged = paged
        self.block_tokens = block_tokens
        self.preemptions = 0
        self.recomputed_tokens = 0  # prefill tokens spent again on preempted requests
        # (gap seconds, tokens): every output token but a request's first, when recording
        self.token_gaps: list[tuple[float, int]] | None = [] if record_token_gaps else None

    def kv_need(self, live: Live) -> int:
        """KV tokens a request holds from admission: its prefill target and one block of
        rounding (paged), or its prompt and whole output (reserve)."""
        if self.paged:
            return live.target + self.block_tokens
        return live.spec.prompt_tokens + live.spec.output_tokens

    def start_iteration(self, r: Replica, now: float) -> IterationFinished | None:
        """Admit what fits and start the replica's next iteration; ``None`` when it has no work."""
        if r.spec.prefill_first:
            return self._start_prefill_first(r, now)
        budget = r.spec.max_batched_tokens - r.num_decodes
        chunks: list[tuple[Live, int]] = []
        p = pairs = kv_p = 0
        for live in r.prefilling:
            if budget <= 0:
                break
            cached = live.prefilled
            n = min(budget, live.target - cached)
            chunks.append((live, n))
            budget -= n
            p += n
            pairs += n * (cached + n)
            kv_p += cached + n
        num_seqs = len(r.prefilling) + r.num_decodes
        served = self.served

        def fits(live: Live) -> bool:  # batch room, then the request's KV under the watermark
            return (budget > 0 and num_seqs < r.spec.max_num_seqs
                    and self.resize_kv(r, r.kv_tokens + self.kv_need(live), now, force=False, watermark=True))

        for queue in (r.preempted, r.waiting):  # preempted requests first, as vLLM does
            for live in admit(queue, served, fits):
                target = live.target
                if self.track_served and not live.generated:
                    served[live.spec.tenant_id] = served.get(live.spec.tenant_id, 0.0) + target
                if math.isnan(live.admitted_s):
                    live.admitted_s = now
                live.kv_base = self.kv_need(live)
                r.prefilling.append(live)
                num_seqs += 1
                n = min(budget, target)
                chunks.append((live, n))
                budget -= n
                p += n
                pairs += n * n
                kv_p += n
        if not chunks and not r.num_decodes:
            return None
        return self._run(r, now, chunks, p, pairs, kv_p, r.num_decodes)

    def _start_prefill_first(self, r: Replica, now: float) -> IterationFinished | None:
        """vLLM v0's scheduling: whole prompts of the requests that fit (token budget, sequence
        limit, KV), in an iteration of their own; a decode iteration when none does."""
        budget = r.spec.max_batched_tokens
        num_seqs = r.num_decodes
        chunks: list[tuple[Live, int]] = []
        p = pairs = 0
        served = self.served

        def fits(live: Live) -> bool:
            return (live.target <= budget and num_seqs < r.spec.max_num_seqs
                    and self.resize_kv(r, r.kv_tokens + self.kv_need(live), now, force=False, watermark=True))

        for queue in (r.preempted, r.waiting):
            for live in admit(queue, served, fits):
                target = live.target
                if self.track_served and not live.generated:
                    served[live.spec.tenant_id] = served.get(live.spec.tenant_id, 0.0) + target
                if math.isnan(live.admitted_s):
                    live.admitted_s = now
                live.kv_base = self.kv_need(live)
                r.prefilling.append(live)
                num_seqs += 1
                chunks.append((live, target))
                budget -= target
                p += target
                pairs += target * target
        if chunks:
            return self._run(r, now, chunks, p, pairs, p, 0, decodes_paused=True)
        if not r.num_decodes:
            return None
        return self._run(r, now, [], 0, 0, 0, r.num_decodes)

    def _run(self, r: Replica, now: float, chunks: list[tuple[Live, int]], p: int, pairs: int, kv_p: int,
             decodes: int, *, decodes_paused: bool = False) -> IterationFinished:
        """Start an iteration of ``chunks`` prefill work and ``decodes`` decodes."""
        duration = r.table.latency_s(p, pairs, kv_p, len(chunks), decodes, r.decode_context_sum if decodes else 0)
        start = self.timelines.earliest_window(r.device_ids, now, duration)
        end = start + duration
        act = int((p + decodes) * r.act_bytes_per_token)
        r.act_allocs = [self.ledger.overflow(d, "activation", r.spec.replica_id, act, at_s=now)
                        for d in r.device_ids]
        r.current = chunks
        r.current_start_s = start
        r.decodes_paused = decodes_paused
        r.busy = True
        self.timelines.occupy(r.device_ids, end)
        return IterationFinished(time_s=end, replica_id=r.spec.replica_id, iteration=r.iteration)

    def finish_iteration(self, r: Replica, now: float) -> tuple[list[Live], int, int]:
        """Account the iteration that ends at ``now``: ``(finished requests in order, KV token
        change, output tokens produced)``. The replica is idle afterwards."""
        ledger = self.ledger
        for a in r.act_allocs:
            ledger.free(a)
        r.act_allocs = []
        # Decode steps are numbered (``r.iteration``; ``r.ends`` holds their end times): a
        # running request's tokens come at consecutive steps. A prefill-only iteration of
        # ``prefill_first`` is not a step: running decodes wait through it.
        paused = r.decodes_paused
        j = r.iteration - 1 if paused else r.iteration  # the step just ended (or the last one)
        finished: list[Live] = []
        track = self.track_served
        served = self.served
        paged = self.paged
        kv_delta = tokens = 0
        if not paused:
            if j >= len(r.ends):
                r.ends = np.concatenate([r.ends, np.zeros(len(r.ends))])
            r.ends[j] = now
            # Every running decode produced one token; its next step sees one more cached token.
            # Reserve: decodes grow into their admission's reservation. Paged: KV grows by a token
            # per decode (the block rounding of :meth:`kv_need` covers partial blocks).
            kv_delta = r.num_decodes if paged else 0
            tokens = r.num_decodes
            if self.token_gaps is not None and tokens:
                self._record_gaps(r, j, now)
            r.decode_context_sum += r.num_decodes
            if track:
                for t, n in r.decoding_by_tenant.items():
                    served[t] = served.get(t, 0.0) + n
            for live in r.finishing.pop(j, ()):
                spec = live.spec
                r.num_decodes -= 1
                r.decode_context_sum -= spec.prompt_tokens + spec.output_tokens - 1
                kv_delta -= self._held(live, j)
                if track:
                    r.decoding_by_tenant[spec.tenant_id] -= 1
                finished.append(live)
        prefilling = r.prefilling
        for live, n in r.current:
            live.prefilled += n
            if live.prefilled < live.target:
                continue
            prefilling.popleft()  # completed prompts form a prefix of the admission order
            tokens += 1
            spec = live.spec
            target = live.target
            if not live.generated:
                live.first_token_s = now
                live.first_iter = j
            else:  # the stall of a preemption: from its last token before it to this one
                live.max_gap_s = max(live.max_gap_s, now - live.preempted_s)
            live.generated += 1
            live.decode_iter = j  # its next tokens come at steps j + 1, j + 2, ...
            live.run_start_s = now
            if self.token_gaps is not None and remaining_after(live) > 0:
                r.run_starts.append((now, 1))
            if track:
                served[spec.tenant_id] = served.get(spec.tenant_id, 0.0) + 1
            remaining = spec.output_tokens - live.generated
            if remaining <= 0:
                kv_delta -= live.kv_base
                finished.append(live)
            else:
                if track:
                    r.decoding_by_tenant[spec.tenant_id] = r.decoding_by_tenant.get(spec.tenant_id, 0) + 1
                r.num_decodes += 1
                r.decode_context_sum += target  # its context: the target, the new token not yet cached
                r.finishing.setdefault(j + remaining, []).append(live)
        r.tokens_out += tokens
        r.current = []
        if kv_delta > 0 and not self._fits(r, r.kv_tokens + kv_delta):
            kv_delta -= self._preempt(r, r.kv_tokens + kv_delta, j, now)
        if kv_delta:
            self.resize_kv(r, r.kv_tokens + kv_delta, now, force=True)
        if not paused:
            r.iteration = j + 1
        r.decodes_paused = False
        r.busy = False
        return finished, kv_delta, tokens

    def _record_gaps(self, r: Replica, j: int, now: float) -> None:
        """The gaps of this step's tokens: since the previous step for running decodes, since
        their first token for decode runs begun after it."""
        gaps = self.token_gaps
        assert gaps is not None
        fresh = 0
        for start, n in r.run_starts:
            gaps.append((now - start, n))
            fresh += n
        r.run_starts = []
        old = r.num_decodes - fresh
        if old > 0 and j > 0:
            gaps.append((now - float(r.ends[j - 1]), old))

    def _held(self, live: Live, j: int) -> int:
        """KV tokens a decoding request holds at the end of iteration ``j``."""
        return live.kv_base + (j - live.decode_iter if self.paged else 0)

    def _preempt(self, r: Replica, want: int, j: int, now: float) -> int:
        """Preempt the newest running requests (recompute: their KV is dropped, they wait at
        the head of the replica's queue) until ``want`` KV tokens minus what they held fits;
        returns the tokens freed."""
        running = [(x, False) for x in r.prefilling]
        running += [(x, True) for lives in r.finishing.values() for x in lives]
        running.sort(key=lambda e: (e[0].admitted_s, e[0].spec.arrival_s, e[0].spec.request_id))
        freed = 0
        victims: list[Live] = []
        while running and not self._fits(r, want - freed):
            victim, decoding = running.pop()  # newest
            spec = victim.spec
            if decoding:
                produced = victim.generated + (j - victim.decode_iter)  # tokens so far
                r.finishing[victim.decode_iter + spec.output_tokens - victim.generated].remove(victim)
                r.num_decodes -= 1
                r.decode_context_sum -= spec.prompt_tokens + produced - 1
                if self.track_served:
                    r.decoding_by_tenant[spec.tenant_id] -= 1
                freed += self._held(victim, j)
                if produced > victim.generated:
                    victim.max_gap_s = max(victim.max_gap_s, _run_max_gap(r, victim, j - victim.decode_iter))
                victim.generated = produced
                victim.preempted_s = now
            else:  # still prefilling: its chunks so far are lost
                r.prefilling.remove(victim)
                freed += victim.kv_base
            self.recomputed_tokens += victim.prefilled
            victim.prefilled = 0
            victim.decode_iter = -1
            victims.append(victim)
            self.preemptions += 1
        for victim in reversed(victims):  # the oldest is readmitted first
            r.preempted.push(_UNKEYED, victim)
        return freed

    def _fits(self, r: Replica, tokens: int) -> bool:
        """Whether the replica's KV can be ``tokens`` tokens with room left for the activations
        of a full iteration (growth may use the admission watermark, as vLLM's does)."""
        size = math.ceil(tokens * r.kv_bytes_per_token)
        act = int(r.spec.max_batched_tokens * r.act_bytes_per_token)
        return all(size - a.size_bytes <= self.ledger.free_bytes(d) - act
                   for d, a in zip(r.device_ids, r.kv_allocs, strict=True))

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


def remaining_after(live: Live) -> int:
    """Output tokens still to come after the ones it has generated."""
    return live.spec.output_tokens - live.generated


def _run_max_gap(r: Replica, live: Live, n: int) -> float:
    """The longest gap between tokens in the request's current decode run: its start token
    (``run_start_s``) and the ``n`` tokens of steps ``decode_iter + 1 ...``."""
    if n <= 0:
        return 0.0
    k = live.decode_iter
    first = float(r.ends[k + 1]) - live.run_start_s
    return max(first, float(np.diff(r.ends[k + 1:k + n + 1]).max())) if n > 1 else first


def request_outcome(r: Replica, live: Live, now: float, sla_classes: Mapping[str, SlaClass]) -> RequestOutcome:
    """The outcome of a request that finished on ``r`` at ``now``."""
    spec = live.spec
    steps = spec.output_tokens - 1
    if steps > 0:
        tbt_mean = float((now - live.first_token_s) / steps)
        tbt_max = max(live.max_gap_s, _run_max_gap(r, live, spec.output_tokens - live.generated))
    else:
        tbt_mean = tbt_max = 0.0
    ttft, e2e = live.first_token_s - spec.arrival_s, now - spec.arrival_s
    sla = sla_classes.get(spec.sla_class) or sla_classes["standard"]
    slack = sla.slack_s(ttft, tbt_mean, e2e, spec.prompt_tokens)
    return RequestOutcome(spec.request_id, spec.tenant_id, spec.model, r.spec.replica_id, spec.sla_class,
                          spec.arrival_s, live.admitted_s, live.first_token_s, now, spec.output_tokens,
                          ttft, tbt_mean, tbt_max, e2e, slack, slack >= 0.0)


def dropped_outcome(req: RequestSpec) -> RequestOutcome:
    """The outcome of a request no replica can ever take."""
    nan = math.nan
    return RequestOutcome(req.request_id, req.tenant_id, req.model, "", req.sla_class, req.arrival_s,
                          nan, nan, nan, 0, nan, nan, nan, nan, -math.inf, False, dropped=True)
