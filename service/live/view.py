"""The live cluster seen through the scheduler's :class:`~service.core.scheduler.ClusterView`.

The live service calls the same ``Scheduler.step(now, view)`` as replay. The view's replicas
and devices are the live truth (a :class:`LiveSnapshot` copied on the event loop, so the step
can run in a worker thread). Its what-ifs run the simulator on a **mirror**: a simulated
cluster of the registered devices and current replicas, anchored to the live truth: the requests
unfinished live (queued or running) are handed to it now, in arrival order, with their true
ages (the window reaches back to the oldest, at most two minutes), and the last ``window_s`` of
arrivals are its history for load forecasts; then it forks as replay does
(:class:`~service.sim.view.SimClusterView`). Iteration
costs come from the service's cost model (``--cost-model``, default the learned one) plus a
per-iteration overhead calibrated from the executors' observations (mean measured iteration
time per model family), which replaces the model's own host overhead for that family.

Time bases: the mirror's clock starts at the window's start (``now_s`` is ``window_s``), so slot
windows and what-ifs are in mirror seconds; the GMG holds the live cluster's slices in epoch
seconds (:mod:`service.domain.slice_state`). ``LiveSnapshot.window_start_wall`` is the one
offset between the two: mirror seconds + it = epoch seconds.

Compute units: an executor daemon runs one iteration at a time, so the view shows one device
per executor (``snap.devices_of`` maps a unit to its devices); decisions are made on units and
:meth:`LiveClusterView.apply` puts them on real devices, the one translation. The mirror's
replicas on one unit share it as the daemon shares its time (weighted by role and TPOT target,
paced: :mod:`service.sim.sharing`).

The mirror's simulated tenants are the live model uids (requests route by model: a tenant may
serve several models).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from service.core.batching import LIVE_BATCHING, BatchingConfig
from service.core.cost import CostModel, IterationOverhead
from service.core.scheduler import (
    Applied,
    Decision,
    DeviceInfo,
    ReplicaChange,
    ReplicaInfo,
    SliceSize,
    WhatIfOutcome,
)
from service.core.slot import ClusterState
from service.domain.cluster import DEVICE_KINDS, ClusterSpec, Device, Link
from service.domain.error import InvariantError
from service.domain.model_config import MODEL_CONFIGS, ModelConfig
from service.domain.request import RequestSpec
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.config import SimConfig
from service.sim.replica import SliceStage
from service.sim.sla import SLA_CLASSES, SlaClass
from service.sim.view import SimClusterView

LIVE_CLUSTER = "live"
INTRA_EXECUTOR = Link("", "", "loopback", 80.0, 20.0)
INTER_EXECUTOR = Link("", "", "network", 10.0, 100.0)
# A unit's replicas share it as its executor daemon does (service.sim.sharing)
LIVE_SIM = SimConfig(device_sharing="executor")


def live_spec(devices: Sequence[tuple[str, str, str, int]]) -> ClusterSpec:
    """A cluster spec of registered devices ``(device_id, executor_id, kind, mem_bytes)``: one
    host per executor, loopback links inside an executor, network links between executors."""
    hosts = sorted({e for _, e, _, _ in devices})
    devs = []
    for device_id, executor_id, kind, mem in devices:
        k = DEVICE_KINDS.get(kind, DEVICE_KINDS["cpu"])
        devs.append(Device(device_id, executor_id, kind, mem, k.peak_flops, k.mem_bw_bytes_per_s))
    links = []
    for a in devs:
        for b in devs:
            if a.device_id != b.device_id:
                proto = INTRA_EXECUTOR if a.host_id == b.host_id else INTER_EXECUTOR
                links.append(Link(a.device_id, b.device_id, proto.kind, proto.gbps, proto.latency_us))
    return ClusterSpec(LIVE_CLUSTER, hosts, devs, links)


@dataclass(frozen=True)
class LiveSnapshot:
    now_s: float  # seconds since the service started
    spec: ClusterSpec
    replicas: tuple[ReplicaInfo, ...]  # device_ids are compute units
    devices: tuple[DeviceInfo, ...]
    max_batch: dict[str, int]  # replica id -> KV slots
    recent: tuple[RequestSpec, ...]  # arrival_s relative to the window's start; tenant_id = model uid
    window_s: float
    window_start_wall: float  # epoch seconds at the mirror's t = 0 (mirror seconds + this = epoch seconds)
    iteration_s: dict[str, float] = field(default_factory=dict)  # family -> observed mean iteration time
    devices_of: dict[str, tuple[str, ...]] = field(default_factory=dict)  # compute unit -> its live devices
    sla_classes: dict[str, SlaClass] = field(default_factory=lambda: dict(SLA_CLASSES))  # by the names in recent
    configs: dict[str, ModelConfig] = field(default_factory=dict)  # family -> config, models from disk included
    pending: frozenset[str] = frozenset()  # ids of the recent requests not finished live (queued or running)
    seen_since: dict[str, float] = field(default_factory=dict)  # model uid -> its first arrival live (mirror seconds)
    # sliced replicas' cuts on compute units (replica id -> its slices, inclusive layer ranges);
    # whether each yields to its owners is its ReplicaInfo.yields_to_owners
    plans: dict[str, tuple[SliceStage, ...]] = field(default_factory=dict)


class DecisionTarget(Protocol):
    """What a decision is applied to: the live state (:meth:`service.live.state.LiveState.apply`)."""

    def apply(self, decision: Decision, devices_of: Mapping[str, tuple[str, ...]]) -> Applied: ...


class LiveClusterView:
    """``target``: where :meth:`apply` puts decisions (none: a read-only view, for previews);
    ``cost_model`` costs the mirror's iterations; ``on_what_if`` is told each what-if's wall
    seconds (the metrics)."""

    def __init__(self, snap: LiveSnapshot, *, cost_model: CostModel, target: DecisionTarget | None = None,
                 batching: BatchingConfig = LIVE_BATCHING, seed: int = 0,
                 on_what_if: Callable[[float], None] | None = None) -> None:
        self.snap = snap
        self.cost_model = cost_model
        self.target = target
        self.on_what_if = on_what_if
        self.batching = batching
        self.seed = seed
        self._built: dict[str, SimClusterView] = {}

    @property
    def _sim(self) -> SimClusterView:
        """The mirror, built on first use: a step with no backlog never pays for it. It shares a
        unit between replicas as the executor does (``LIVE_SIM``), a rule for whole replicas only:
        with a sliced guest in place it is replay's mirror instead (:attr:`_sliced_sim`)."""
        return self._sliced_sim if self.snap.plans else self._mirror(LIVE_SIM)

    @property
    def _sliced_sim(self) -> SimClusterView:
        """The mirror that can run sliced replicas: units taken in turns, a sliced guest under
        owner priority at slice boundaries (replay's rules, :mod:`service.sim.pipeline`). It
        judges sliced plans; whole replicas are judged on :attr:`_sim` while none is in place."""
        return self._mirror(SimConfig())

    def _mirror(self, config: SimConfig) -> SimClusterView:
        key = config.device_sharing
        if key not in self._built:
            snap = self.snap
            overheads = {family: IterationOverhead(per_iteration_s=s, separate_prefill_passes=True)
                         for family, s in snap.iteration_s.items()}
            replicas = [ReplicaSpec(r.replica_id, r.family, r.device_ids, max_num_seqs=snap.max_batch[r.replica_id],
                                    tenant_id=r.model_uid, guest=r.guest, stages=snap.plans.get(r.replica_id, ()),
                                    turns=r.replica_id in snap.plans and not r.yields_to_owners)
                        for r in snap.replicas if not r.draining]
            mirror = SimulatedCluster(snap.spec, replicas, self.cost_model, rng=np.random.default_rng(self.seed),
                                      overheads=overheads, model_configs={**MODEL_CONFIGS, **snap.configs},
                                      sla_classes=snap.sla_classes, config=config)
            # Anchored to the truth: every request counts as arrived (the forecast's history), but
            # only those unfinished live are simulated, handed over now with their true ages: the
            # mirror's queues are the live queues, whatever its speed over the window would say.
            # A model's history reaches back to its first arrival live (before the window: all of it).
            mirror.note_arrivals(sorted(snap.recent, key=lambda r: r.arrival_s), seen_since=snap.seen_since)
            mirror.release([r for r in snap.recent if r.request_id in snap.pending], at_s=snap.window_s)
            mirror.run_to(snap.window_s)
            self._built[key] = SimClusterView(mirror, batching=self.batching, model_uid=lambda tenant, family: tenant)
        return self._built[key]

    # ---- ClusterView: the live truth ----------------------------------------------------------
    @property
    def now_s(self) -> float:
        """The mirror's clock (the end of its replayed window): slot windows are in its time."""
        return self.snap.window_s

    @property
    def spec(self) -> ClusterSpec:
        return self.snap.spec

    def replicas(self) -> Sequence[ReplicaInfo]:
        return self.snap.replicas

    def devices(self) -> Sequence[DeviceInfo]:
        return self.snap.devices

    # ---- ClusterView: sizes, costs and what-ifs from the mirror --------------------------------
    def weight_bytes(self, family: str) -> int:
        return self._sim.weight_bytes(family)

    def kv_reserve_bytes(self, family: str) -> int:
        return self._sim.kv_reserve_bytes(family)

    def slice_sizes(self, family: str, layers_per_slice: int) -> Sequence[SliceSize]:
        return self._sim.slice_sizes(family, layers_per_slice)

    def slot_state(self) -> ClusterState:
        return self._sim.slot_state()

    def iteration_s(self, family: str, tp: int) -> float:
        observed = self.snap.iteration_s.get(family)
        return observed / tp if observed else self._sim.iteration_s(family, tp)

    def what_if(self, change: ReplicaChange, horizon_s: float, *, drain_s: float = 0.0
                ) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        with self._timed():
            return (self._sliced_sim if change.stages else self._sim).what_if(change, horizon_s, drain_s=drain_s)

    def drain_what_if(self, replica_id: str, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome]:
        with self._timed():
            return self._sim.drain_what_if(replica_id, horizon_s)

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Tell ``on_what_if`` the wall seconds of the what-if run inside (the metrics)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.on_what_if is not None:
                self.on_what_if(time.perf_counter() - started)

    def apply(self, decision: Decision) -> Applied:
        if self.target is None:
            raise InvariantError("a read-only live view applies no decision")
        return self.target.apply(decision, self.snap.devices_of)

    # ---- compute units -------------------------------------------------------------------------
    def unit_of(self, device_id: str) -> str | None:
        """The compute unit (executor) of a live device."""
        return next((u for u, ds in self.snap.devices_of.items() if device_id in ds), None)

