"""Operator-level slices of a simulated cluster (a part of
:class:`~service.sim.cluster.SimulatedCluster`): how a *sliced* replica's iterations run.

A sliced replica (``ReplicaSpec.stages``) is a tenant's model whose layers are cut into slices
(contiguous layer ranges, see :mod:`service.core.cut`), each placed on a device that another
tenant owns. Each iteration's batch runs slice after slice: a slice starts when its input
activations have arrived (a transfer queued first come first served on the link from the
previous slice's device, its buffer held on the destination) and its device gives way.

Owner priority, at slice boundaries
    A device's owners are the non-guest replicas on it. A guest slice starts only when no owner
    is running or about to run there; otherwise it waits in the device's guest queue, which is
    served when the device falls idle. Between two owner iterations one waiting guest slice may
    run when the owner has no request waiting (a backlog has no gap: its requests' TTFT runs, as
    the executor counts a pressed owner as due) and its SLA slack covers it: the owner's last
    iteration plus the slice's predicted p90 stays within ``guest_slack_fraction`` of the
    tightest TPOT target among the owner's decoding requests. Hence the stated bound: an owner
    iteration is delayed by at most one guest slice (its actual duration), whether it was queued
    or arrived while the slice ran.

Turns (``ReplicaSpec.turns``)
    A slice takes the first window on its device that is free for its whole duration, behind the
    work already committed there (first come first served, as the iterations of replicas that
    share a device do): the owners neither wait for it at a boundary nor hold it back while they
    are busy. A whole model on one device under turns is a guest replica cut into slices.

Admission
    A sliced guest admits only what it can start now: at each iteration it takes, after its own
    queue, the heads of its tenant's other replicas' queues while they fit its batch and KV, and
    an arriving request is routed to it only when its own queue is empty and it has a free batch
    slot (:mod:`service.sim.routing`), so its requests never wait behind a slower pipeline.

A slice's duration is its share of the iteration (its layers over the model's) of the
iteration's single-device latency from the replica's cost table; its p90 is that times the
cost model's p90/p50 ratio for the model. Memory: each device holds its slices' weights and
its layers' share of the KV (see :func:`service.sim.replica.build_replica`) and the
iteration's activations while the iteration is in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from service.core.cost import CostModel
from service.domain.cluster import ClusterSpec
from service.sim.config import SimConfig
from service.sim.engine import Engine, Event, IterationFinished, StageFinished, StageReady
from service.sim.iteration import dtype_bytes
from service.sim.replica import Replica
from service.sim.report import SimObserver
from service.sim.resource import TransferTiming
from service.sim.sla import SlaClass
from service.sim.state import SimState

__all__ = ["SlicedReplicas"]

_NOW_EPS_S = 1e-12


class SlicedReplicas:
    spec: ClusterSpec
    config: SimConfig
    state: SimState
    engine: Engine
    cost_model: CostModel
    sla_classes: dict[str, SlaClass]
    _observers: list[SimObserver]

    # provided by the cluster: a link transfer, and the end of a replica's iteration
    transfer: Callable[..., TransferTiming]
    _on_iteration_finished: Callable[[IterationFinished], list[Event]]

    # ---- a sliced replica's slices ------------------------------------------------------------
    def _on_stage_ready(self, ev: StageReady) -> list[Event]:
        r = self.state.replicas.get(ev.replica_id)
        if r is None:
            return []
        dev = r.spec.stages[ev.stage].device_id
        duration = self.stage_s(r, ev.stage)
        if r.spec.turns:  # behind what is committed there, first come first served
            return [self._start_stage(r, ev.stage, self.state.timelines.earliest_window((dev,), ev.time_s, duration))]
        if self._device_free(dev, ev.time_s, duration) and not self._owner_wants(dev):
            return [self._start_stage(r, ev.stage, ev.time_s)]
        self.state.guest_waiting[dev].append((ev.replica_id, ev.iteration, ev.stage))
        return []

    def _on_stage_finished(self, ev: StageFinished) -> list[Event]:
        st = self.state
        now = ev.time_s
        r = st.replicas[ev.replica_id]
        stages = r.spec.stages
        dev = stages[ev.stage].device_id
        st.timelines.release(dev, _slice_id(r, ev.stage))
        for obs in self._observers:
            obs.slice_executed(dev, r.stage_start_s, now, r.spec.replica_id)
        out: list[Event] = []
        nxt = ev.stage + 1
        if nxt < len(stages):
            to = stages[nxt].device_id
            ready = now
            if to != dev:  # the residual stream of the batch moves over the link
                tokens = sum(n for _, n in r.current) + (0 if r.decodes_paused else r.num_decodes)
                ready = self.transfer(dev, to, tokens * r.config.d_model * dtype_bytes(r.config)).arrival_s
            out.append(StageReady(time_s=ready, replica_id=ev.replica_id, iteration=ev.iteration, stage=nxt))
        else:
            out += self._on_iteration_finished(IterationFinished(time_s=now, replica_id=ev.replica_id,
                                                                 iteration=ev.iteration))
        out += self._serve_guests((dev,), now)
        return out

    def _start_stage(self, r: Replica, stage: int, now: float) -> StageFinished:
        """Run slice ``stage`` of the current iteration from ``now`` (the present, or under turns
        the start of the first free window)."""
        dev = r.spec.stages[stage].device_id
        end = now + self.stage_s(r, stage)
        self.state.timelines.reserve(dev, now, end, _slice_id(r, stage))
        r.stage_start_s = now
        return StageFinished(time_s=end, replica_id=r.spec.replica_id, iteration=r.iteration, stage=stage)

    @staticmethod
    def stage_s(r: Replica, stage: int) -> float:
        """Predicted median seconds of slice ``stage`` of the replica's current iteration."""
        return r.iteration_s * r.stage_share[stage]

    # ---- owners and their devices -----------------------------------------------------------
    def _device_free(self, dev: str, now: float, duration_s: float = _NOW_EPS_S) -> bool:
        """Free from ``now`` for ``duration_s`` (a slice under turns may hold a later window)."""
        return self.state.timelines.earliest_window((dev,), now, max(duration_s, _NOW_EPS_S)) <= now

    def _owner_wants(self, dev: str) -> bool:
        st = self.state
        return any(not o.spec.guest and (o.busy or o.step_pending)
                   for o in (st.replicas[rid] for rid in st.by_device[dev]))

    def _serve_guests(self, device_ids: Iterable[str], now: float) -> list[Event]:
        """Start the next waiting guest slice on each device that is free and whose owners
        do not want it."""
        st = self.state
        out: list[Event] = []
        for dev in device_ids:
            queue = st.guest_waiting.get(dev)
            if queue and not self._owner_wants(dev):
                rid, _, stage = queue[0]
                guest = st.replicas[rid]
                if self._device_free(dev, now, self.stage_s(guest, stage)):
                    queue.pop(0)
                    out.append(self._start_stage(guest, stage, now))
        return out

    def _guest_in_gap(self, owner: Replica, now: float) -> list[Event]:
        """Between two iterations of ``owner``: one waiting guest slice per device of the owner,
        when the owner's TPOT slack covers it (see the module doc)."""
        st = self.state
        out: list[Event] = []
        tbt = math.inf
        for dev in owner.device_ids:
            queue = st.guest_waiting.get(dev)
            if not queue:
                continue
            rid, _, stage = queue[0]
            guest = st.replicas[rid]
            if not self._device_free(dev, now, self.stage_s(guest, stage)):
                continue
            if tbt == math.inf:
                tbt = self._tightest_tbt(owner)
                if not owner.num_decodes or tbt == math.inf or owner.waiting or owner.preempted:
                    return out
            p90 = self.stage_s(guest, stage) * guest.p90_ratio
            if (now - owner.current_start_s) + p90 <= self.config.guest_slack_fraction * tbt:
                queue.pop(0)
                out.append(self._start_stage(guest, stage, now))
        return out

    def _tightest_tbt(self, owner: Replica) -> float:
        classes = self.sla_classes
        return min((classes.get(live.spec.sla_class, classes["standard"]).tbt_s
                    for lives in owner.finishing.values() for live in lives), default=math.inf)


def _slice_id(r: Replica, stage: int) -> str:
    return f"{r.spec.replica_id}/slice{stage}"
