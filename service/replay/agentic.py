"""Workflow replay: agentic workflows on a simulated cluster, with a router, a queue policy and
optionally a scaler, measured per workflow.

One run (:func:`run_agentic`):

1. replicas: without a scaler, each tenant's model gets whole devices in proportion to its
   offered work (the container split of :func:`service.core.placement.container_replicas`,
   from the true work of the run, a strong static baseline); with a scaler every tenant starts
   on one replica and the scaler adds and drains them every ``interval_s`` from the free
   devices (a new replica copies its weights over the link after ``startup_s``);
2. the workflows run through :class:`~service.sim.workflow.WorkflowDriver` until the horizon,
   then up to ``cutoff_factor`` times it; a workflow unfinished by then counts as late;
3. an adaptive predictor observes every finished call and tool, and is refitted and swapped in
   every ``refit_every_s`` simulated seconds (the service's schedule, in simulated time).

Records of every finished call and tool (features at release, truth) are what
``slicesched predictors train`` learns from (:func:`write_records`, :func:`read_records`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from service.cluster.spec import load_cluster_spec
from service.core.batching import SIM_BATCHING
from service.core.cost import CostModel
from service.core.placement import TenantDemand, container_replicas
from service.core.queue import QueuePolicy, SlackPolicy, make_queue_policy
from service.core.tail import CallFeatures, TailPredictor, ToolFeatures
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS
from service.domain.workflow import ModelCall, Workflow
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.iteration import BatchFeatures, IterationCostTable, kv_bytes_per_token, weight_bytes
from service.sim.tail_routing import Router, TenantReplicas, make_router, make_scaler
from service.sim.workflow import CallRecord, ToolRecord, WorkflowDriver, WorkflowOutcome
from service.workload.workflows import ShapeConfig, TraceLengths, generate

__all__ = [
    "RECORD_LOADS",
    "RECORD_ROUTERS",
    "AdaptivePredictor",
    "AgenticConfig",
    "AgenticResult",
    "default_shapes",
    "record_runs",
    "run_agentic",
    "shape_workflows",
    "warmup_s",
]

#: Workflows per second of each shape at load 1.0 on 8xA100-nvlink (about what its eight
#: devices sustain with the container split; the benchmark sweeps multiples of it).
BASE_RATES: dict[str, float] = {"code-generation": 0.5, "deep-research": 0.35, "multimodal": 4.0}


#: Loads and routers of the runs a predictor is trained from (:func:`record_runs`).
RECORD_LOADS: tuple[float, ...] = (0.5, 1.5, 3.0)
RECORD_ROUTERS: tuple[str, ...] = ("least-loaded", "round-robin")


def default_shapes() -> dict[str, ShapeConfig]:
    """One tenant per shape: its model and end-to-end SLO (a few times the unloaded latency of
    a typical workflow of the shape, measured on 8xA100-nvlink)."""
    return {"code-generation": ShapeConfig("coder", "llama2-13b", 90.0),
            "deep-research": ShapeConfig("research", "llama2-7b", 120.0),
            "multimodal": ShapeConfig("vision", "llama2-7b", 15.0)}


def shape_workflows(lengths: TraceLengths, load: float, *, duration_s: float, seed: int,
                    shapes: Mapping[str, ShapeConfig] | None = None,
                    rates: Mapping[str, float] | None = None) -> list[Workflow]:
    """The three shapes at ``load`` times :data:`BASE_RATES` (or ``rates``), seeded."""
    base = rates or BASE_RATES
    return generate(np.random.default_rng(seed), lengths, {s: r * load for s, r in base.items()},
                    shapes or default_shapes(), duration_s=duration_s)


class AdaptivePredictor(TailPredictor, Protocol):
    """A predictor that learns online: observations between refits, :meth:`refit` swaps in the
    model trained on them (``learned.distributional.OnlinePredictor``)."""

    def observe_call(self, features: CallFeatures, output_tokens: int, latency_s: float) -> None: ...

    def observe_tool(self, features: ToolFeatures, duration_s: float) -> None: ...

    def refit(self) -> bool: ...


@dataclass
class AgenticConfig:
    cluster: ClusterSpec
    cost_model: CostModel
    shapes: dict[str, ShapeConfig] = field(default_factory=default_shapes)
    seed: int = 0
    tool_slots: int = 64  # CPU slots of the tool executors
    interval_s: float = 5.0  # scaler and refit step
    startup_s: float = 20.0  # a new replica's engine start-up, before its weights are copied
    cutoff_factor: float = 3.0  # stop at horizon * factor; unfinished workflows count as late
    refit_every_s: float = 60.0  # online refit of an adaptive predictor
    max_num_seqs: int = 64  # per replica (what a 13B deployment on one A100 runs with)

    @staticmethod
    def on(cluster: str, cost_model: CostModel, **kw: Any) -> AgenticConfig:
        return AgenticConfig(load_cluster_spec(cluster), cost_model, **kw)


@dataclass
class AgenticResult:
    router: str
    queue: str
    scaler: str
    outcomes: list[WorkflowOutcome]
    horizon_s: float
    cutoff_s: float
    replica_s: float  # replica-seconds held (devices in use x time), to the cut-off
    calls: list[CallRecord] = field(default_factory=list)
    tools: list[ToolRecord] = field(default_factory=list)
    refits: int = 0

    def latencies(self) -> np.ndarray:
        """Per workflow; an unfinished one counts as lasting to the cut-off (a lower bound)."""
        return np.array([o.latency_s if not math.isnan(o.finish_s) else self.cutoff_s - o.arrival_s
                         for o in self.outcomes])

    def summary(self) -> dict[str, Any]:
        lat = self.latencies()
        met = sum(o.slo_met for o in self.outcomes)
        n = len(self.outcomes)
        by_shape = {}
        for shape in sorted({o.shape for o in self.outcomes}):
            sl = np.array([x for x, o in zip(lat, self.outcomes, strict=True) if o.shape == shape])
            ok = [o.slo_met for o in self.outcomes if o.shape == shape]
            by_shape[shape] = {"n": len(sl), "p50_s": float(np.percentile(sl, 50)), "p99_s": float(np.percentile(sl, 99)),
                               "slo_attainment": sum(ok) / len(ok)}
        return {"router": self.router, "queue": self.queue, "scaler": self.scaler, "num_workflows": n,
                "unfinished": sum(math.isnan(o.finish_s) for o in self.outcomes),
                "failed": sum(o.failed for o in self.outcomes),
                "p50_s": float(np.percentile(lat, 50)) if n else 0.0, "p90_s": float(np.percentile(lat, 90)) if n else 0.0,
                "p99_s": float(np.percentile(lat, 99)) if n else 0.0, "slo_attainment": met / n if n else 1.0,
                "goodput_wf_per_s": met / self.horizon_s, "replica_s": self.replica_s, "refits": self.refits,
                "by_shape": by_shape}


class _Recorder:
    def __init__(self, predictor: AdaptivePredictor | None) -> None:
        self.calls: list[CallRecord] = []
        self.tools: list[ToolRecord] = []
        self.predictor = predictor

    def call_finished(self, record: CallRecord) -> None:
        self.calls.append(record)
        if self.predictor is not None:
            self.predictor.observe_call(record.features, record.output_tokens, record.latency_s)

    def tool_finished(self, record: ToolRecord) -> None:
        self.tools.append(record)
        if self.predictor is not None:
            self.predictor.observe_tool(record.features, record.duration_s)


class _RoutedWork:
    """Tells a router that counts dispatched work (``finished(request_id)``) when a call ends."""

    def __init__(self, router_ref: list[Router]) -> None:
        self.router_ref = router_ref

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        pass

    def request_finished(self, outcome: Any) -> None:
        finished = getattr(self.router_ref[0], "finished", None) if self.router_ref else None
        if finished is not None:
            finished(outcome.request_id)


def _demands(config: AgenticConfig, workflows: Sequence[Workflow]) -> list[TenantDemand]:
    """Offered work per tenant in device-seconds per second: each call's prompt as one pass
    plus its output tokens at the per-token cost of a 32-sequence decode batch."""
    device = config.cluster.devices[0]
    horizon = max((w.arrival_s for w in workflows), default=0.0) or 1.0
    work: dict[str, float] = {s.tenant_id: 0.0 for s in config.shapes.values()}
    tables: dict[str, IterationCostTable] = {}
    for w in workflows[:: max(1, len(workflows) // 400)]:
        outputs = {s.step_id: s.output_tokens or 0 for s in w.steps}
        for s in w.steps:
            if not isinstance(s, ModelCall):
                continue
            table = tables.get(s.model) or tables.setdefault(
                s.model, IterationCostTable(MODEL_CONFIGS[s.model], config.cost_model, device))
            prompt = min(3500, w.prompt_tokens(s.step_id, outputs))
            out = s.output_tokens or 1
            prefill = table.exact_s(BatchFeatures.of([(prompt, 0)], []))
            decode = table.exact_s(BatchFeatures.of([], [prompt + out // 2] * 32)) / 32
            work[w.tenant_id] += prefill + out * decode
    sampled = len(workflows[:: max(1, len(workflows) // 400)]) or 1
    scale = len(workflows) / sampled / horizon
    models = {s.tenant_id: s.model for s in config.shapes.values()}
    return [TenantDemand(t, models[t], v * scale) for t, v in work.items()]


def _initial_replicas(config: AgenticConfig, workflows: Sequence[Workflow], scaled: bool) -> list[ReplicaSpec]:
    tenants = [(s.tenant_id, s.model) for s in config.shapes.values()]
    if scaled:
        devices = [d.device_id for d in config.cluster.devices]
        if len(devices) < len(tenants):
            raise InvalidInputError(f"{config.cluster.name}: fewer devices than tenants")
        return [ReplicaSpec(f"{t}/1", m, (devices[i],), SIM_BATCHING.max_batched_tokens, config.max_num_seqs,
                            tenant_id=t) for i, (t, m) in enumerate(tenants)]

    def reserve(model: str) -> int:
        return SIM_BATCHING.kv_reserve_tokens * kv_bytes_per_token(MODEL_CONFIGS[model])

    groups = container_replicas(config.cluster, _demands(config, workflows),
                                weight_bytes=lambda m: weight_bytes(MODEL_CONFIGS[m]), reserve_bytes=reserve)
    count: dict[str, int] = {}
    out = []
    for tenant, model, group in groups:
        count[tenant] = count.get(tenant, 0) + 1
        out.append(ReplicaSpec(f"{tenant}/{count[tenant]}", model, group, SIM_BATCHING.max_batched_tokens,
                               config.max_num_seqs, tenant_id=tenant))
    return out


def _queue_policy(name: str, driver_ref: list[WorkflowDriver]) -> QueuePolicy | None:
    if name == "fifo":
        return None
    if name == "slack":
        return SlackPolicy(latest_start=lambda q: driver_ref[0].latest_start(q))
    return make_queue_policy(name)


def run_agentic(config: AgenticConfig, workflows: Sequence[Workflow], *, router: str, queue: str = "fifo",
                scaler: str | None = None, predictor: TailPredictor | None = None,
                adaptive: AdaptivePredictor | None = None, horizon_s: float | None = None,
                record: bool = False) -> AgenticResult:
    """One replay (module docstring). ``predictor`` answers the routers, the slack policy and
    the tail scaler; ``adaptive`` (usually the same object) also observes and refits online."""
    horizon = horizon_s if horizon_s is not None else max((w.arrival_s for w in workflows), default=0.0)
    driver_ref: list[WorkflowDriver] = []
    router_ref: list[Router] = []
    cluster = SimulatedCluster(
        config.cluster, _initial_replicas(config, workflows, scaler is not None), config.cost_model,
        rng=np.random.default_rng(config.seed), queue_policy=_queue_policy(queue, driver_ref),
        router=lambda req, ids, c: router_ref[0](req, ids, c), observers=[_RoutedWork(router_ref)])
    recorder = _Recorder(adaptive)
    driver = WorkflowDriver(cluster, tool_slots=config.tool_slots, predictor=predictor, observers=[recorder])
    driver_ref.append(driver)
    router_ref.append(make_router(router, driver, predictor, seed=config.seed))
    the_scaler = make_scaler(scaler, predictor) if scaler is not None else None
    driver.submit(workflows)
    cutoff = max(horizon * config.cutoff_factor, horizon + 60.0)
    t = 0.0
    replica_s = 0.0
    refits = 0
    refit_rounds = 1  # the next refit is due at refit_rounds * refit_every_s (no running sum: no drift)
    steps = 0
    while t < cutoff and (t < horizon or driver.runs or cluster.engine.peek() is not None):
        # Step k ends at k * interval (a running sum of intervals drifts: see runner.run_policy).
        steps += 1
        end = min(cutoff, steps * config.interval_s)
        step = end - t
        cluster.run_to(end)
        t = end
        replica_s += step * sum(len(cluster.replica_spec(r).device_ids) for r in cluster.replica_ids)
        if the_scaler is not None and t < horizon:
            _apply(config, cluster, the_scaler.decide(t, driver, _tenant_replicas(config, cluster), _num_free(cluster)))
        if adaptive is not None and t >= refit_rounds * config.refit_every_s:
            refits += adaptive.refit()
            refit_rounds += 1
        if t >= horizon and not driver.runs:
            break
    outcomes = sorted(driver.outcomes + driver.unfinished(cutoff), key=lambda o: o.arrival_s)
    return AgenticResult(router, queue, scaler or "none", outcomes, horizon, cutoff, replica_s,
                         recorder.calls if record else [], recorder.tools if record else [], refits)


def warmup_s(config: AgenticConfig, model: str) -> float:
    """Seconds from asking for a replica of ``model`` to its serving: the engine's start-up
    (``config.startup_s``) plus its weights copied over the cluster's slowest device-to-device
    link (bytes over the link's bandwidth: what :meth:`SimulatedCluster.add_replica` simulates)."""
    links = [link for link in config.cluster.links if link.src != link.dst]
    if not links:
        return config.startup_s
    slowest = min(links, key=lambda link: link.bytes_per_s)
    return config.startup_s + weight_bytes(MODEL_CONFIGS[model]) / slowest.bytes_per_s + slowest.latency_us * 1e-6


def _tenant_replicas(config: AgenticConfig, cluster: SimulatedCluster) -> list[TenantReplicas]:
    st = cluster.state
    now = cluster.now_s
    out = []
    for s in config.shapes.values():
        mine = [r for r in st.by_model.get(s.model, []) if st.replicas[r].spec.tenant_id == s.tenant_id
                and r not in st.draining]
        ready = tuple(r for r in mine if st.ready_at.get(r, 0.0) <= now)
        out.append(TenantReplicas(s.tenant_id, s.model, ready, len(mine) - len(ready), warmup_s(config, s.model)))
    return out


def _free_devices(cluster: SimulatedCluster) -> list[str]:
    return sorted(d for d, rs in cluster.state.by_device.items() if not rs)


def _num_free(cluster: SimulatedCluster) -> int:
    return len(_free_devices(cluster))


def _apply(config: AgenticConfig, cluster: SimulatedCluster, actions: Iterable[Any]) -> None:
    st = cluster.state
    for a in actions:
        if a.kind == "drain":
            if a.replica_id in st.replicas and a.replica_id not in st.draining:
                cluster.drain_replica(a.replica_id)
            continue
        free = _free_devices(cluster)
        if not free:
            continue
        source = next((st.replicas[r].device_ids[0] for r in st.by_model.get(a.model, [])), None)
        n = 1 + sum(1 for r in st.replicas if r.startswith(f"{a.tenant_id}/"))
        rid = f"{a.tenant_id}/+{n}@{cluster.now_s:g}"
        cluster.add_replica(ReplicaSpec(rid, a.model, (free[0],), SIM_BATCHING.max_batched_tokens,
                                        config.max_num_seqs, tenant_id=a.tenant_id),
                            weights_from=source, startup_s=config.startup_s)


# ---- records ---------------------------------------------------------------------------------
def record_runs(config: AgenticConfig, lengths: TraceLengths, *, duration_s: float, seed: int,
                loads: Sequence[float] = RECORD_LOADS,
                routers: Sequence[str] = RECORD_ROUTERS) -> tuple[list[CallRecord], list[ToolRecord]]:
    """Records to train a predictor from: the three shapes at each of ``loads``, each replayed
    with each of ``routers`` (workload seed ``seed``).

    More than one router because a router asks the predictor about *every* candidate replica,
    the busy ones too: runs logged under least-loaded routing alone only show it balanced
    replicas (the state features barely vary), and a model fitted there answers the other
    replicas' states by extrapolation. Round robin, blind to load, leaves replicas unevenly
    busy and so covers the states the routers and scalers ask about.
    """
    calls: list[CallRecord] = []
    tools: list[ToolRecord] = []
    for load in loads:
        wfs = shape_workflows(lengths, load, duration_s=duration_s, seed=seed)
        for router in routers:
            r = run_agentic(config, wfs, router=router, horizon_s=duration_s, record=True)
            calls += r.calls
            tools += r.tools
    return calls, tools


