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
                  aware: a call off the critical path goes where its own p99 is lowest),
                  over two candidates drawn at random, with the work already dispatched
                  counted (:mod:`service.core.router`: the herd broken)
``tail-argmin``   the same prediction, argmin over every candidate, no dispatched work
                  counted (the router before the herd was broken; a reference)
================  =====================================================================

Scalers size each tenant's replicas between ``scale_interval_s`` steps of the replay
(:mod:`service.replay.agentic`), through the run-time replica mechanism
(:meth:`~service.sim.cluster.SimulatedCluster.add_replica` with a weight copy, and
:meth:`~service.sim.cluster.SimulatedCluster.drain_replica`):

- ``reactive``: a tenant's device utilisation over the last interval above ``high`` adds a
  replica, below ``low`` drains its least loaded one (the utilisation-threshold autoscaler);
- ``tail``: the predicted p99 latency of the tenant's typical call on its replicas, over the
  same call's p99 on an idle replica (the predicted queueing tail), projected to when a new
  replica would be ready (its warm-up: engine start-up and weight copy) with the replicas
  already warming counted; above ``up`` adds a replica (worst tenant first while devices
  last), and a tenant with none warming whose tail would stay under ``down`` with one replica
  fewer (its load spread over the rest) drains one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from service.core.router import Candidate, PowerOfDRouter
from service.core.tail import P50, P99, TailPredictor, mean_of
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
    """Predicted-tail routing through :class:`~service.core.router.PowerOfDRouter` (the object
    the live service can use too): each candidate's score is the predicted p99 completion of
    the call's workflow (the call's p99 latency on the replica plus the p99 path after it,
    against the predicted p99 finish of the workflow's other branches), plus the outstanding
    work the router dispatched there; a dispatched call counts its p50 latency on an idle
    replica until it finishes (:meth:`finished`, from the cluster's observer hook).

    ``d=0, count_outstanding=False`` is the argmin over every candidate (``tail-argmin``:
    the router that herds, kept as a reference)."""

    name = "tail"

    def __init__(self, driver: WorkflowDriver, predictor: TailPredictor, *, d: int = 2,
                 count_outstanding: bool = True, rng: np.random.Generator | None = None) -> None:
        self.driver = driver
        self.predictor = predictor
        # its own stream (seeded by the caller), so the workload's draws do not move with the router's
        self.router = PowerOfDRouter(rng if rng is not None else np.random.default_rng(0), d=d,
                                     count_outstanding=count_outstanding)
        if d == 0 and not count_outstanding:
            self.name = "tail-argmin"

    def __call__(self, req: RequestSpec, candidates: Sequence[str], cluster: SimulatedCluster) -> str:
        now = cluster.now_s
        after, others = self.driver.downstream_p99(req.request_id)
        p99_of: dict[str, float] = {}

        def predict(looked: Sequence[Candidate]) -> list[float]:
            feats = [self.driver.call_features(req, self.driver.replica_state(c.replica_id)) for c in looked]
            p99 = self.predictor.call_quantiles(feats)[:, 1, P99]
            p99_of.update({c.replica_id: float(x) for c, x in zip(looked, p99, strict=True)})
            return [max(now + float(x) + after, others) - now for x in p99]

        def service_s(_: str) -> float:
            return float(self.predictor.call_quantiles([self.driver.call_features(req, IDLE)])[0, 1, P50])

        rows = [Candidate(c, cluster.replica_load(c), cluster.replica_spec(c).max_num_seqs,
                          cluster.can_ever_fit(req, c)) for c in candidates]
        if not any(r.can_admit for r in rows):  # the cluster drops what fits nowhere; keep its choice
            rows = [replace(r, can_admit=True) for r in rows]
        best = self.router.choose(req.request_id, rows, predict, service_s)
        self.driver.note_routed(req.request_id, best, now + p99_of[best])
        return best

    def finished(self, request_id: str) -> None:
        self.router.finished(request_id)


RouterName = Literal["round-robin", "least-loaded", "mean", "tail", "tail-argmin"]
ROUTERS: tuple[RouterName, ...] = ("round-robin", "least-loaded", "mean", "tail", "tail-argmin")
Router = RoundRobinRouter | LeastLoadedRouter | MeanRouter | TailRouter


def make_router(name: str, driver: WorkflowDriver, predictor: TailPredictor | None, *, seed: int = 0) -> Router:
    """The router ``name``; ``seed`` seeds the tail routers' choice of candidates."""
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name in ("mean", "tail", "tail-argmin"):
        if predictor is None:
            raise InvalidInputError(f"router {name!r} needs a predictor", culprit=name)
        if name == "mean":
            return MeanRouter(driver, predictor)
        rng = np.random.default_rng([seed, 0x7A11])
        return TailRouter(driver, predictor, rng=rng) if name == "tail" else TailRouter(
            driver, predictor, d=0, count_outstanding=False, rng=rng)
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
    """A tenant's ready, not draining replicas (and its model), the replicas it has warming up
    (added, weights still copying or the engine starting), and how long a new one takes to
    warm up (``warmup_s``: engine start-up plus the weight copy over the link, 0: unknown)."""

    tenant_id: str
    model: str
    replica_ids: tuple[str, ...]
    warming: int = 0
    warmup_s: float = 0.0


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
    """Scales on the predicted queueing tail (module docstring), with warm-up modelled: a new
    replica serves only ``warmup_s`` after it is asked for (engine start-up plus its weight
    copy), so

    - the ratio that decides is the one projected to when a replica added now would be ready:
      the current ratio plus its growth over the last interval, extrapolated over ``warmup_s``
      (a tail that grows is answered before it arrives; one that falls is not);
    - replicas warming up count as capacity already on the way (the load spread over them as
      well), so a tail does not add a replica every interval of one warm-up;
    - nothing is drained while a replica of the tenant is warming up.
    """

    name = "tail"

    def __init__(self, predictor: TailPredictor, *, up: float = 2.0, down: float = 1.3, min_replicas: int = 1) -> None:
        self.predictor = predictor
        self.up, self.down, self.min_replicas = up, down, min_replicas
        self._last: dict[str, tuple[float, float]] = {}  # tenant -> (time, ratio) at the last decision

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

    def projected_ratio(self, now: float, driver: WorkflowDriver, t: TenantReplicas) -> float:
        """The tail ratio when a replica asked for now would be ready (see the class docstring)."""
        n = len(t.replica_ids)
        ratio = self.tail_ratio(driver, t, n / (n + t.warming))
        last = self._last.get(t.tenant_id)
        self._last[t.tenant_id] = (now, ratio)
        if last is None or now <= last[0] or t.warmup_s <= 0:
            return ratio
        growth_per_s = (ratio - last[1]) / (now - last[0])
        return ratio + max(0.0, growth_per_s) * t.warmup_s

    def decide(self, now: float, driver: WorkflowDriver, tenants: Sequence[TenantReplicas],
               num_free: int) -> list[ScaleAction]:
        ratios = {t.tenant_id: self.projected_ratio(now, driver, t) for t in tenants if t.replica_ids}
        out: list[ScaleAction] = []
        for t in sorted(tenants, key=lambda t: (-ratios.get(t.tenant_id, 0.0), t.tenant_id)):
            if t.tenant_id not in ratios:
                continue
            n = len(t.replica_ids)
            if ratios[t.tenant_id] > self.up and num_free > 0:
                out.append(ScaleAction("add", t.tenant_id, t.model))
                num_free -= 1
            elif (not t.warming and n > self.min_replicas
                  and self.tail_ratio(driver, t, n / (n - 1)) < self.down):
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
