"""Trace replay: the scheduler's very ``Scheduler.step`` driving the simulated cluster.

For each policy ``QUEUE/PLACEMENT`` and each offered load, the run:

1. samples the tenant mix into a workload (same seed for every policy: identical requests);
2. sizes every tenant's home devices from its share of the offered work (the container
   allocation; the slice policy starts from the same homes); on a cluster with fewer devices
   than its tenants need apart, the sharing placements pack one replica per tenant onto shared
   devices instead (:mod:`service.core.pooling`) and container cannot run;
3. fits the output-length estimator on a *previous* sample of the mix (another seed: the
   service's history), then calibrates it online from completions during the run;
4. advances the simulation in steps of ``interval_s``, calling ``Scheduler.step`` and applying
   its decision, until the trace horizon; then lets queued work finish (up to a cut-off);
5. summarises the run (:mod:`service.replay.report`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.core.batching import SIM_BATCHING, BatchingConfig
from service.core.cost import CostModel
from service.core.placement import TenantDemand, container_replicas
from service.core.policies import make_placement_policy
from service.core.pooling import pooled_replicas, tenants_fit_apart
from service.core.queue import make_queue_policy
from service.core.scheduler import Scheduler
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import Workload
from service.replay.mix import TenantMix, build_workload
from service.replay.oracle import ORACLE_ELASTIC, OracleElastic
from service.replay.report import PolicyResult, WhatIfLog, summarise
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.config import SimConfig
from service.sim.iteration import BatchFeatures, IterationCostTable, kv_bytes_per_token, weight_bytes
from service.sim.view import SimClusterView

Progress = Callable[[str, float], None]  # (run label, fraction of the horizon simulated)

#: Placements whose tenants keep devices of their own even where that does not fit the cluster
#: (container allocation by definition; the ceiling pools its own way): the others pool homes then.
WHOLE_DEVICE_HOMES = ("container", ORACLE_ELASTIC)


@dataclass(frozen=True)
class PolicyName:
    queue: str
    placement: str

    @staticmethod
    def parse(text: str) -> PolicyName:
        queue, sep, placement = text.partition("/")
        if not sep or not queue or not placement:
            raise InvalidInputError(f"a policy is QUEUE/PLACEMENT (e.g. fifo/container), got {text!r}")
        make_queue_policy(queue)  # validates the names
        if placement != ORACLE_ELASTIC:  # the ceiling is replay-only, not a placement policy
            make_placement_policy(placement)
        return PolicyName(queue, placement)

    def __str__(self) -> str:
        return f"{self.queue}/{self.placement}"


@dataclass
class ReplayConfig:
    cluster: ClusterSpec
    mix: TenantMix
    cost_model: CostModel
    seed: int = 0
    duration_s: float | None = None  # default: the mix's
    interval_s: float = 5.0  # scheduling step
    cutoff_factor: float = 2.0  # stop at horizon * factor; unfinished requests count as late
    batching: BatchingConfig = SIM_BATCHING  # replica limits, chunk choices and the KV reserve
    sim: SimConfig = field(default_factory=SimConfig)  # memory margin and KV watermark
    slice_params: dict[str, Any] = field(default_factory=dict)

    @property
    def horizon_s(self) -> float:
        return self.duration_s or self.mix.duration_s


class SpanRecorder:
    """Observer keeping the slices that overlap a time window (for the timeline plot)."""

    def __init__(self, window_s: tuple[float, float]) -> None:
        self.window_s = window_s
        self.spans: dict[str, list[tuple[float, float, str]]] = {}

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        lo, hi = self.window_s
        if end_s >= lo and start_s <= hi:
            self.spans.setdefault(device_id, []).append((start_s, end_s, owner))

    def request_finished(self, outcome: object) -> None:
        pass


def check_fits(cluster: ClusterSpec, mix: TenantMix) -> None:
    """Every model of the mix must fit the cluster (tensor parallel within one host)."""
    per_host: dict[str, list[int]] = {}
    for d in cluster.devices:
        per_host.setdefault(d.host_id, []).append(d.mem_bytes)
    largest_host = max(sum(v) for v in per_host.values())
    for t in mix.tenants:
        need = weight_bytes(MODEL_CONFIGS[t.model])
        if need > 0.9 * largest_host:
            raise InvalidInputError(
                f"tenant {t.tenant_id}: {t.model} needs {need / 2**30:.0f} GiB of weights; the largest host of "
                f"{cluster.name} has {largest_host / 2**30:.0f} GiB")


def demands(config: ReplayConfig, workload: Workload) -> list[TenantDemand]:
    """Offered work per tenant in device-seconds per second (one device of the cluster's kind):
    each request's prompt as one pass plus its output tokens at the per-token cost of a
    32-sequence decode batch."""
    device = config.cluster.devices[0]
    out = []
    for t in config.mix.tenants:
        reqs = [r for r in workload.requests if r.tenant_id == t.tenant_id]
        table = IterationCostTable(MODEL_CONFIGS[t.model], config.cost_model, device)
        work = 0.0
        for r in reqs[:: max(1, len(reqs) // 300)]:  # a sample is enough for a share
            prefill = table.exact_s(BatchFeatures.of([(r.prompt_tokens, 0)], []))
            ctx = r.prompt_tokens + r.output_tokens // 2
            decode = table.exact_s(BatchFeatures.of([], [ctx] * 32)) / 32
            work += prefill + r.output_tokens * decode
        sampled = len(reqs[:: max(1, len(reqs) // 300)]) or 1
        out.append(TenantDemand(t.tenant_id, t.model, work * len(reqs) / sampled / workload.duration_s))
    return out


def chunk_tokens(config: ReplayConfig, model: str, sla_class: str, tp: int) -> int:
    """Token budget of one iteration for a tenant (chunked prefill, as Sarathi-Serve tunes it):
    the largest chunk whose iteration, with 32 decodes riding along, stays within half the
    tenant's time-per-output-token target, so prompts do not stall running decodes."""
    target = 0.5 * config.mix.sla_classes[sla_class].tbt_s
    table = IterationCostTable(MODEL_CONFIGS[model], config.cost_model, config.cluster.devices[0])
    choices = config.batching.chunk_choices_tokens
    best = choices[0]
    for chunk in choices:
        if table.exact_s(BatchFeatures.of([(chunk, 0)], [1024] * 32)) / tp <= target:
            best = chunk
    return min(best, config.batching.max_batched_tokens)


def tenant_chunks(config: ReplayConfig, replicas: Sequence[ReplicaSpec]) -> dict[str, int]:
    return {r.tenant_id: r.max_batched_tokens for r in replicas if r.tenant_id is not None}


def home_replicas(config: ReplayConfig, workload: Workload, *, pool: bool = False) -> list[ReplicaSpec]:
    """Each tenant's home replicas: container allocation (whole devices of its own); with ``pool``,
    where the cluster has fewer devices than the tenants' groups, one replica per tenant packed
    onto shared devices instead (:mod:`service.core.pooling`)."""
    def reserve(model: str) -> int:
        return config.batching.kv_reserve_tokens * kv_bytes_per_token(MODEL_CONFIGS[model])

    def weights(model: str) -> int:
        return weight_bytes(MODEL_CONFIGS[model])

    offered = demands(config, workload)
    if pool and not tenants_fit_apart(config.cluster, offered, weight_bytes=weights, reserve_bytes=reserve):
        groups = pooled_replicas(config.cluster, offered, weight_bytes=weights, reserve_bytes=reserve)
    else:
        groups = container_replicas(config.cluster, offered, weight_bytes=weights, reserve_bytes=reserve)
    count: dict[str, int] = {}
    out = []
    for tenant, model, devices in groups:
        count[tenant] = count.get(tenant, 0) + 1
        chunk = chunk_tokens(config, model, config.mix.tenant(tenant).sla_class, len(devices))
        out.append(ReplicaSpec(f"{tenant}/{count[tenant]}", model, devices, chunk, config.batching.max_num_seqs,
                               tenant_id=tenant))
    return out


def fitted_estimator(config: ReplayConfig) -> Any:
    from learned.estimator import OutputLengthEstimator

    history = build_workload(config.mix, np.random.default_rng(config.seed + 10_007), duration_s=config.horizon_s)
    return OutputLengthEstimator().fit(history.requests)


def run_policy(config: ReplayConfig, workload: Workload, policy: PolicyName, *, load_scale: float = 1.0,
               progress: Progress | None = None, timeline_window_s: tuple[float, float] | None = None
               ) -> tuple[PolicyResult, dict[str, list[tuple[float, float, str]]]]:
    started = time.perf_counter()
    queue = make_queue_policy(policy.queue)
    params = config.slice_params if policy.placement in ("replica", "slice", "slice-fixed") else {}
    if policy.placement == "slice" and params.get("whatif_wall_s") is not None:
        params = {**params, "clock": time.perf_counter}  # the wall-time cap's clock (core reads none)
    oracle = policy.placement == ORACLE_ELASTIC
    scheduler = Scheduler(make_placement_policy("container" if oracle else policy.placement, **params))
    horizon = config.horizon_s
    # ten minutes around the middle of the run (or all of a shorter run): plotted whole and zoomed
    window = timeline_window_s or (max(0.0, horizon / 2 - 300.0), min(horizon, horizon / 2 + 300.0))
    spans = SpanRecorder(window)
    priority = {t.tenant_id: t.priority for t in config.mix.tenants}
    weight = {t.tenant_id: t.weight for t in config.mix.tenants}
    homes = home_replicas(config, workload, pool=policy.placement not in WHOLE_DEVICE_HOMES)
    cluster = SimulatedCluster(
        config.cluster, homes, config.cost_model,
        rng=np.random.default_rng(config.seed), sla_classes=config.mix.sla_classes, config=config.sim,
        queue_policy=queue,
        estimator=fitted_estimator(config) if queue.needs_estimate or policy.queue != "fifo" else None,
        tenant_priority=priority, tenant_weight=weight, observers=[spans])
    view = SimClusterView(cluster, batching=config.batching, tenant_chunks=tenant_chunks(config, homes))
    elastic = None
    if oracle:
        elastic = OracleElastic(
            workload, [(t.tenant_id, t.model) for t in config.mix.tenants], cluster=cluster,
            interval_s=config.interval_s, kv_reserve_tokens=config.batching.kv_reserve_tokens,
            max_num_seqs=config.batching.max_num_seqs,
            chunk=lambda t, m, tp: chunk_tokens(config, m, config.mix.tenant(t).sla_class, tp), homes=homes)
    cluster.submit(workload)
    label = f"{policy} x{load_scale:g}"
    guests = whatifs = 0
    notes: list[str] = []
    reasons: list[dict[str, Any]] = []  # the same first 100 lines in fields, with their step's time
    statuses: dict[str, int] = {}  # steps by status code
    log = WhatIfLog()
    t = 0.0
    steps = 0
    if elastic is not None:
        cluster.run(until=0.0)  # the oracle chooses with the arrivals at 0 in (its forks carry no arrivals)
        guests += elastic.step(0.0)
    while t < horizon:
        # Step k ends at k * interval, not at a running sum of intervals: a sum drifts (ten steps
        # of 0.1 s end at 0.9999999999999999) and would add a step of 1e-16 s before the horizon.
        steps += 1
        t = min(horizon, steps * config.interval_s)
        cluster.run(until=t)
        if elastic is not None:
            guests += elastic.step(t)
            if progress is not None:
                progress(label, t / horizon)
            continue
        view.mark()
        decision, applied = scheduler.step_and_apply(t, view)
        whatifs += decision.num_whatifs
        log.add(t, decision)
        guests += len(applied.added)
        if len(notes) < 100:
            notes += [f"t={t:.0f}s {n}" for n in decision.notes][:100 - len(notes)]
            reasons += [{"t_s": round(t, 3), **r.as_dict()} for r in decision.reasons][:100 - len(reasons)]
        code = decision.status.code if decision.status is not None else "unsaid"
        statuses[code] = statuses.get(code, 0) + 1
        if progress is not None:
            progress(label, t / horizon)
    produced = cluster.tokens_out
    cluster.run(until=horizon * config.cutoff_factor)
    result = summarise(str(policy), load_scale, workload, cluster.report(), horizon_s=horizon,
                       home_replica_ids={h.replica_id: h.tenant_id for h in homes if h.tenant_id is not None})
    result.num_guest_replicas = guests
    result.num_whatifs = whatifs
    result.decisions = notes
    result.decision_reasons = reasons
    result.step_status = statuses
    result.whatifs = log.summary()
    if elastic is not None:  # how often each of its options won the step
        result.decisions = ["oracle steps: " + ", ".join(f"{k} {v}" for k, v in elastic.choices.items())]
    result.horizon_tokens_per_s = produced / horizon
    result.wall_s = time.perf_counter() - started
    return result, spans.spans


def sustained_load(results: Sequence[PolicyResult], *, sla_target: float = 0.09) -> float:
    """Highest offered load with SLA violations <= target, interpolated between sweep points
    (0 when even the lowest load violates; the highest tried when none does)."""
    pts = sorted((r.load_scale, r.sla_violation_rate) for r in results)
    best = 0.0
    for (l0, v0), (l1, v1) in itertools.pairwise(pts):
        if v0 <= sla_target < v1:
            return l0 + (l1 - l0) * (sla_target - v0) / (v1 - v0)
        if v1 <= sla_target:
            best = l1
    if pts and pts[0][1] <= sla_target:
        best = max(best, pts[0][0])
    return best if not math.isnan(best) else 0.0
