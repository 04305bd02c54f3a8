"""Routers of workflow calls and scalers of replicas, from load or from predicted tails.

Routers are the cluster's ``router(request, replica_ids, cluster) -> replica_id`` (asked only
when a request has several candidates). Every decision is deterministic for the cluster's seed:
ties go to the first candidate in replica order (least-loaded: the cluster's ``rng``).

================  =====================================================================
``round-robin``   candidates of a model in turn
``least-loaded``  fewest requests in the replica (the cluster's default)
``mean``          smallest predicted *mean* latency of this call on the replica
``tail``          smallest predicted p99 completion of the call's *workflow*: the call's
                  p99 latency on the replica plus the p99 path after it, against the
                  predicted p99 finish of the workflow's other branches (critical-path
                  aware: a call off the critical path goes where its own p99 is lowest)
================  =====================================================================

Scalers size each tenant's replicas between ``scale_interval_s`` steps of the replay
(:mod:`service.replay.agentic`), through the run-time replica mechanism
(:meth:`~service.sim.cluster.SimulatedCluster.add_replica` with a weight copy, and
:meth:`~service.sim.cluster.SimulatedCluster.drain_replica`):

- ``reactive``: a tenant's device utilisation over the last interval above ``high`` adds a
  replica, below ``low`` drains its least loaded one (the utilisation-threshold autoscaler);
- ``tail``: the predicted p99 latency of the tenant's typical call on its replicas, over the
  same call's p99 on an idle replica (the predicted queueing tail); above ``up`` adds a
  replica (worst tenant first while devices last), and a tenant whose tail would stay under
  ``down`` with one replica fewer (its load spread over the rest) drains one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from service.core.tail import P99, TailPredictor, mean_of
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.sim.cluster import SimulatedCluster
from service.sim.workflow import IDLE, ReplicaState, WorkflowDriver, with_state

__all__ = ["ROUTERS", "SCALERS", "LeastLoadedRouter", "MeanRouter", "ReactiveScaler", "RoundRobinRouter",
           "ScaleAction", "Scaler", "TailRouter", "TailScaler", "make_router", "make_scaler"]


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def __call__(self, req: RequestSpec, candidates: Sequence[str], cluster: SimulatedCluster) -> str:
        ordered = sorted(candidates)
        i = self._next.get(req.model, 0)
        self._next[req.model] = i + 1
        return ordered[i % len(ordered)]


class LeastLoadedRouter:
    name = "least-loaded"

    def __call__(self, req: RequestSpec, candidates: Sequence[str], cluster: SimulatedCluster) -> str:
        loads = [cluster.replica_load(c) for c in candidates]
        ties = [c for c, load in zip(candidates, loads, strict=True) if load == min(loads)]
        return ties[0] if len(ties) == 1 else ties[int(cluster.rng.integers(len(ties)))]


class MeanRouter:
    name = "mean"

    def __init__(self, driver: WorkflowDriver, predictor: TailPredictor) -> None:
        self.driver = driver
        self.predictor = predictor

    def __call__(self, req: RequestSpec, candidates: Sequence[str], cluster: SimulatedCluster) -> str:
        feats = [self.driver.call_features(req, self.driver.replica_state(c)) for c in candidates]
        means = mean_of(self.predictor.call_quantiles(feats)[:, 1])
        return candidates[int(np.argmin(means))]


class TailRouter:
    name = "tail"

    def __init__(self, driver: WorkflowDriver, predictor: TailPredictor) -> None:
        self.driver = driver
        self.predictor = predictor

    def __call__(self, req: RequestSpec, candidates: Sequence[str], cluster: SimulatedCluster) -> str:
        feats = [self.driver.call_features(req, self.driver.replica_state(c)) for c in candidates]
        p99 = self.predictor.call_quantiles(feats)[:, 1, P99]
        after, others = self.driver.downstream_p99(req.request_id)
        now = cluster.now_s
        tail = np.maximum(now + p99 + after, others)
        best = min(range(len(candidates)), key=lambda i: (float(tail[i]), float(p99[i]), i))
        self.driver.note_routed(req.request_id, candidates[best], now + float(p99[best]))
        return candidates[best]


RouterName = Literal["round-robin", "least-loaded", "mean", "tail"]
ROUTERS: tuple[RouterName, ...] = ("round-robin", "least-loaded", "mean", "tail")
Router = RoundRobinRouter | LeastLoadedRouter | MeanRouter | TailRouter


def make_router(name: str, driver: WorkflowDriver, predictor: TailPredictor | None) -> Router:
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name in ("mean", "tail"):
        if predictor is None:
            raise InvalidInputError(f"router {name!r} needs a predictor", culprit=name)
        return MeanRouter(driver, predictor) if name == "mean" else TailRouter(driver, predictor)
    raise InvalidInputError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}", culprit=name)


# ---- scalers ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScaleAction:
    kind: Literal["add", "drain"]
    tenant_id: str
    model: str
    replica_id: str = ""  # drain: which one


@dataclass(frozen=True, slots=True)
class TenantReplicas:
    """A tenant's ready, not draining replicas (and its model)."""

    tenant_id: str
    model: str
    replica_ids: tuple[str, ...]


class Scaler(Protocol):
    name: str

    def decide(self, now: float, driver: WorkflowDriver, tenants: Sequence[TenantReplicas],
               num_free: int) -> list[ScaleAction]: ...


class ReactiveScaler:
    name = "reactive"

    def __init__(self, *, high: float = 0.8, low: float = 0.3, min_replicas: int = 1) -> None:
        self.high, self.low, self.min_replicas = high, low, min_replicas
        self._busy: dict[str, float] = {}
        self._at = 0.0

    def decide(self, now: float, driver: WorkflowDriver, tenants: Sequence[TenantReplicas],
               num_free: int) -> list[ScaleAction]:
        cluster = driver.cluster
        busy = cluster.metrics.busy_s()
        window = now - self._at
        out: list[ScaleAction] = []
        for t in tenants:
            devices = [d for r in t.replica_ids for d in cluster.replica_spec(r).device_ids]
            if not devices or window <= 0:
                continue
            util = sum(busy[d] - self._busy.get(d, 0.0) for d in devices) / (window * len(devices))
            if util > self.high and num_free > 0:
                out.append(ScaleAction("add", t.tenant_id, t.model))
                num_free -= 1
            elif util < self.low and len(t.replica_ids) > self.min_replicas:
                least = min(t.replica_ids, key=lambda r: (cluster.replica_load(r), r))
                out.append(ScaleAction("drain", t.tenant_id, t.model, least))
        self._busy, self._at = busy, now
        return out


def _spread(s: ReplicaState, factor: float) -> ReplicaState:
    return ReplicaState(round(s.queue_len * factor), round(s.running * factor), s.kv_frac * factor,
                        round(s.queued_prompt_tokens * factor))


class TailScaler:
    name = "tail"

    def __init__(self, predictor: TailPredictor, *, up: float = 2.0, down: float = 1.3, min_replicas: int = 1) -> None:
        self.predictor = predictor
        self.up, self.down, self.min_replicas = up, down, min_replicas

    def tail_ratio(self, driver: WorkflowDriver, t: TenantReplicas, spread: float = 1.0) -> float:
        """Predicted p99 of the tenant's typical call on its replicas (median over them), over
        the same call's p99 on an idle replica; ``spread`` scales each replica's load."""
        probe = driver.probe(t.tenant_id)
        if probe is None:
            return 0.0
        states = [_spread(driver.replica_state(r), spread) for r in t.replica_ids]
        feats = [with_state(probe, s) for s in [IDLE, *states]]
        p99 = self.predictor.call_quantiles(feats)[:, 1, P99]
        return float(np.median(p99[1:]) / max(1e-9, p99[0]))

    def decide(self, now: float, driver: WorkflowDriver, tenants: Sequence[TenantReplicas],
               num_free: int) -> list[ScaleAction]:
        ratios = {t.tenant_id: self.tail_ratio(driver, t) for t in tenants if t.replica_ids}
        out: list[ScaleAction] = []
        for t in sorted(tenants, key=lambda t: (-ratios.get(t.tenant_id, 0.0), t.tenant_id)):
            if t.tenant_id not in ratios:
                continue
            n = len(t.replica_ids)
            if ratios[t.tenant_id] > self.up and num_free > 0:
                out.append(ScaleAction("add", t.tenant_id, t.model))
                num_free -= 1
            elif n > self.min_replicas and self.tail_ratio(driver, t, n / (n - 1)) < self.down:
                least = min(t.replica_ids, key=lambda r: (driver.cluster.replica_load(r), r))
                out.append(ScaleAction("drain", t.tenant_id, t.model, least))
        return out


SCALERS: tuple[str, ...] = ("reactive", "tail")


def make_scaler(name: str, predictor: TailPredictor | None) -> Scaler:
    if name == "reactive":
        return ReactiveScaler()
    if name == "tail":
        if predictor is None:
            raise InvalidInputError("scaler 'tail' needs a predictor", culprit=name)
        return TailScaler(predictor)
    raise InvalidInputError(f"unknown scaler {name!r}; known: {', '.join(SCALERS)}", culprit=name)
