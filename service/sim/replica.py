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

from service.core.batching import SIM_BATCHING
from service.core.cost import CostModel, IterationOverhead, predict_slice, slice_of
from service.core.cut import Granularity
from service.core.memory import Allocation, MemoryLedger
from service.core.queue import FifoQueue, WaitingQueue
from service.domain.cluster import ClusterSpec, Device
from service.domain.error import InvalidInputError
from service.domain.model_config import ModelConfig
from service.domain.request import RequestSpec
from service.models.cut import cut_model, traced_graph
from service.sim.iteration import (
    CostTables,
    IterationCostTable,
    activation_bytes_per_token,
    kv_bytes_per_token,
    layers_weight_bytes,
    weight_bytes,
)
from service.sim.report import RequestOutcome
from service.sim.sla import SlaClass

__all__ = ["Live", "OutputEstimator", "Replica", "ReplicaSpec", "SliceStage", "build_replica", "dropped_outcome",
           "request_outcome"]


@dataclass(frozen=True, slots=True)
class SliceStage:
    """One slice of a sliced replica's iteration: layers ``first_layer..last_layer`` (inclusive)
    run on ``device_id`` (see :mod:`service.sim.pipeline`)."""

    device_id: str
    first_layer: int
    last_layer: int

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer + 1


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
    # Operator-level slices: each iteration runs as these slices in order, each on its device
    # (``device_ids`` are their distinct devices); empty: whole iterations on ``device_ids``.
    stages: tuple[SliceStage, ...] = ()
    # Sliced only: its slices take turns with the owners' iterations first come first served (as
    # a whole guest replica's iterations do) instead of yielding to them at slice boundaries.
    turns: bool = False


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
    # Sliced replicas only (``spec.stages``): per device (in ``device_ids`` order) the share of
    # the model's KV it holds and its weight bytes; per stage the share of an iteration's cost.
    kv_scale: tuple[float, ...] = ()
    weights_on: tuple[int, ...] = ()
    stage_share: tuple[float, ...] = ()
    p90_ratio: float = 1.0  # the cost model's p90 over p50 for an iteration of this model
    iteration_s: float = 0.0  # the current iteration's single-device duration (sliced)
    stage_start_s: float = 0.0  # when the current slice started (sliced)
    # Sliced: what its last iteration waited for the owners' gaps (its span, start to end, less
    # its own run time): what each token of a request there waits beyond the model's own pace
    # (NaN until one ended); see service.sim.routing.
    gap_wait_s: float = math.nan

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
                  configs: Mapping[str, ModelConfig], tables: CostTables,
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
    if rs.stages:
        return _build_sliced(rs, config, devices=devices, tables=tables, overheads=overheads,
                             ledger=ledger, waiting=waiting)
    tp = len(rs.device_ids)
    link = cluster.link(rs.device_ids[0], rs.device_ids[1]) if tp > 1 else None
    if tp > 1 and link is None:
        raise InvalidInputError(f"replica {rs.replica_id}: no link between its devices", culprit=rs.replica_id)
    table = tables.table(config, devices[rs.device_ids[0]], tp_degree=tp, link=link, overhead=overheads.get(rs.model))
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


def _build_sliced(rs: ReplicaSpec, config: ModelConfig, *, devices: Mapping[str, Device], tables: CostTables,
                  overheads: Mapping[str, IterationOverhead], ledger: MemoryLedger,
                  waiting: WaitingQueue[Live]) -> Replica:
    """A replica whose iterations run as slices of consecutive layers, each on its device:
    weights and KV of a layer live where it runs (nothing allocated if any check fails)."""
    stages = rs.stages
    expect = 0
    for st in stages:
        if st.device_id not in devices:
            raise InvalidInputError(f"replica {rs.replica_id}: unknown device {st.device_id!r}", culprit=st.device_id)
        if st.first_layer != expect or st.last_layer < st.first_layer:
            raise InvalidInputError(f"replica {rs.replica_id}: slices must cover layers 0..{config.n_layers - 1} "
                                    f"in order (got {st.first_layer}..{st.last_layer} after {expect - 1})",
                                    culprit=rs.replica_id)
        expect = st.last_layer + 1
    if expect != config.n_layers:
        raise InvalidInputError(f"replica {rs.replica_id}: slices end at layer {expect - 1}, "
                                f"{rs.model} has {config.n_layers}", culprit=rs.replica_id)
    order = tuple(dict.fromkeys(st.device_id for st in stages))
    if order != rs.device_ids:
        raise InvalidInputError(f"replica {rs.replica_id}: device_ids must be the slices' devices in order",
                                culprit=rs.replica_id)
    weights = dict.fromkeys(order, 0)
    layers = dict.fromkeys(order, 0)
    for st in stages:
        weights[st.device_id] += layers_weight_bytes(config, st.first_layer, st.last_layer)
        layers[st.device_id] += st.num_layers
    kv_allocs: list[Allocation] = []
    for d in order:
        if ledger.allocate(d, "weights", f"{rs.replica_id}/weights", weights[d]) is None:
            for got in [a for dev in order for a in ledger.allocations(dev) if a.owner == f"{rs.replica_id}/weights"]:
                ledger.free(got)
            raise InvalidInputError(f"replica {rs.replica_id}: {weights[d]} weight bytes do not fit on {d}", culprit=d)
        kv = ledger.allocate(d, "kv_cache", f"{rs.replica_id}/kv", 0)
        if kv is None:  # an empty allocation always fits
            raise InvalidInputError(f"replica {rs.replica_id}: no KV allocation on {d}", culprit=d)
        kv_allocs.append(kv)
    first = devices[order[0]]
    table = tables.table(config, first, overhead=overheads.get(rs.model))
    ranges = tuple((st.first_layer, st.last_layer) for st in stages)
    shares, p90_ratio = slice_latency_shares(config, ranges, tables.cost_model, first)
    n = config.n_layers
    return Replica(spec=rs, config=config, table=table, kv_bytes_per_token=kv_bytes_per_token(config),
                   act_bytes_per_token=activation_bytes_per_token(config), waiting=waiting, preempted=FifoQueue(),
                   kv_allocs=kv_allocs, act_allocs=[], prefilling=deque(), finishing={}, current=[],
                   decoding_by_tenant={}, ends=np.zeros(1024), kv_scale=tuple(layers[d] / n for d in order),
                   weights_on=tuple(weights[d] for d in order), stage_share=shares, p90_ratio=p90_ratio)


_SHARES: dict[tuple[int, str, tuple[tuple[int, int], ...], Device], tuple[CostModel, tuple[tuple[float, ...], float]]] = {}


def slice_latency_shares(config: ModelConfig, ranges: tuple[tuple[int, int], ...], cost_model: CostModel,
                         device: Device) -> tuple[tuple[float, ...], float]:
    """Each slice's share of an iteration and the largest p90/p50 among them, from the cost
    model on each slice's own operator subgraph of the traced decode graph (its real edges:
    :func:`service.core.cost.predict_slice`; the GNN where the artifact chose it). A slice covers
    layers ``first..last``; operators outside the layers go with the first and the last slice,
    as :func:`service.core.cut.cut_graph` places them."""
    key = (id(cost_model), config.name, ranges, device)  # the entry keeps the model alive: ids stay unique
    hit = _SHARES.get(key)
    if hit is None:
        hit = _SHARES[key] = (cost_model, _shares(config, ranges, cost_model, device))
    return hit[1]


def _shares(config: ModelConfig, ranges: tuple[tuple[int, int], ...], cost_model: CostModel,
            device: Device) -> tuple[tuple[float, ...], float]:
    cuts = cut_model(config, "decode", Granularity(1))
    graph = traced_graph(config, "decode")
    lats = []
    for first, last in ranges:
        op_ids = [op for c in cuts[first:last + 1] for op in c.op_ids]
        ops, edges = slice_of(graph, op_ids)
        lats.append(predict_slice(cost_model, ops, edges, device))
    total = sum(x.p50_s for x in lats)
    if total <= 0:
        return tuple((b - a + 1) / config.n_layers for a, b in ranges), 1.0
    return tuple(x.p50_s / total for x in lats), max(x.p90_s / x.p50_s if x.p50_s > 0 else 1.0 for x in lats)


def remaining_after(live: Live) -> int:
    """Output tokens still to come after the ones it has generated."""
    return live.spec.output_tokens - live.generated


def run_max_gap(r: Replica, live: Live, n: int) -> float:
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
        tbt_max = max(live.max_gap_s, run_max_gap(r, live, spec.output_tokens - live.generated))
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
