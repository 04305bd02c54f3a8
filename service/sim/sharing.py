"""How replicas that share a device take turns on it (a part of
:class:`~service.sim.cluster.SimulatedCluster`), by :attr:`SimConfig.device_sharing
<service.sim.config.SimConfig.device_sharing>`.

``"turns"`` (the default; replay)
    An iteration that finds its device busy is committed behind the work already there, first
    come first served: replicas sharing a device alternate iteration by iteration, whatever each
    iteration costs.

``"executor"`` (the live mirror, :mod:`service.live.view`)
    As an executor daemon shares its time (:mod:`executor.worker`): a replica that wants its
    device while another's iteration runs there waits, and when the device falls free the next
    iteration is picked among the replicas that want it, its batch formed then. First a replica
    with a request waiting for its prefill and a free KV slot (*admitting*); else among the
    *due* ones (a request waiting, or half its KV slots or more taken, or :data:`TPOT_PACE` of
    its tightest TPOT target passed since its last iteration began), else among all; of those
    the least virtual time: busy seconds over weight, the weight being the role's
    (:data:`GUEST_WEIGHT` for a guest, 1 for an owner) over the tightest TPOT target among its
    requests (:data:`DEFAULT_TPOT_S` where none is set). A replica that wakes from idle starts
    level with the least virtual time of those already busy there, so idling banks no credit.

    Why the mirror needs it: on the live demo an interactive guest whose iterations cost 34 ms
    beside a standard owner's 2.4 ms ones (and a batch owner's 3 ms) took its share of the
    executor and the standard owner missed none of its 260 requests (per-request traces of
    three runs); under turns the owner gets one 2.4 ms iteration per 40 ms round, and every
    what-if predicted 16 to 66 of its requests late, so the scheduler held the busy tenant's
    guest back for as long as the owner was busy.

    It models whole replicas on one device each (the live view's compute units). A replica on
    several devices (a live replica across executors) still commits its iterations first come
    first served, after the replicas waiting on its devices have had theirs; a sliced replica
    under it is refused (``InvalidInputError``).

The executor's constants are repeated here (the service does not import the executor); a test
holds the two equal.
"""

from __future__ import annotations

import math
from itertools import islice

from service.sim.batcher import Batcher
from service.sim.config import SimConfig
from service.sim.engine import Event
from service.sim.replica import Replica
from service.sim.sla import SlaClass
from service.sim.state import SimState

__all__ = ["DEFAULT_TPOT_S", "GUEST_WEIGHT", "MIN_TPOT_S", "TPOT_PACE", "SharedDevices"]

GUEST_WEIGHT = 0.5  # executor.settings.GUEST_WEIGHT: a guest's claim on the device against an owner's 1
TPOT_PACE = 0.5  # executor.worker.TPOT_PACE: due this share of the tightest TPOT after its last start
DEFAULT_TPOT_S = 1.0  # executor.worker.DEFAULT_TPOT_S: the target of a request that sets none
MIN_TPOT_S = 1e-3  # executor.worker.MIN_TPOT_S: targets below this weigh as this


class SharedDevices:
    config: SimConfig
    state: SimState
    sla_classes: dict[str, SlaClass]
    _batcher: Batcher

    def _executor_device(self, r: Replica) -> str | None:
        """The replica's device when the executor's sharing rule applies to it, else ``None``."""
        if self.config.device_sharing != "executor" or len(r.spec.device_ids) != 1:
            return None
        return r.spec.device_ids[0]

    def _hand_over(self, r: Replica, now: float) -> list[Event]:
        """Before a replica on several devices commits its next iteration there (first come
        first served), the replicas waiting on those devices get theirs."""
        st = self.state
        out: list[Event] = []
        for dev in r.spec.device_ids:
            if st.wanting[dev] and st.holder.get(dev) is None and st.timelines.free_at_s(dev) <= now:
                out += self._arbitrate(dev, now, also=None)
        return out

    def _want(self, r: Replica, dev: str, now: float) -> list[Event]:
        """``r`` has work for ``dev``: it starts now if the device is free, else it waits there."""
        st = self.state
        rid = r.spec.replica_id
        if st.holder.get(dev) is None and st.timelines.free_at_s(dev) <= now:
            return self._arbitrate(dev, now, also=r)
        wanting = st.wanting[dev]
        if rid not in wanting:
            active = [st.vtime.get(x, 0.0) for x in (*wanting, st.holder.get(dev)) if x is not None and x != rid]
            if active:  # waking from idle: level with the least busy virtual time
                st.vtime[rid] = max(st.vtime.get(rid, 0.0), min(active))
            wanting.append(rid)
        return []

    def _release(self, replica_id: str, now: float, also: Replica | None) -> list[Event]:
        """The iteration of ``replica_id`` ended at ``now``: give each device it held to the
        next replica (``also``, the replica that ran it, competes when it has more work)."""
        st = self.state
        out: list[Event] = []
        for dev in [d for d, h in st.holder.items() if h == replica_id]:
            del st.holder[dev]
            out += self._arbitrate(dev, now, also=also)
        return out

    def _arbitrate(self, dev: str, now: float, also: Replica | None) -> list[Event]:
        """Start the next iteration on the free device ``dev``: the pick of the module doc
        among the replicas waiting there and ``also``; those with nothing to run drop out, and
        ``also``, when not picked, waits there with the others."""
        st = self.state
        wanting = st.wanting[dev]
        candidates = [st.replicas[x] for x in wanting]
        if also is not None and also.spec.replica_id not in wanting and not also.busy:
            candidates.append(also)
        while candidates:
            r = self._pick(candidates, now) if len(candidates) > 1 else candidates[0]
            candidates.remove(r)
            rid = r.spec.replica_id
            if rid in wanting:
                wanting.remove(rid)
            ev = self._batcher.start_iteration(r, now)
            if ev is None:  # nothing it can run now (it is woken again by arrivals or freed memory)
                continue
            st.holder[dev] = rid
            wanting.extend(x.spec.replica_id for x in candidates if x.spec.replica_id not in wanting)  # ``also``
            st.vtime[rid] = st.vtime.get(rid, 0.0) + (ev.time_s - now) / self._weight(r)
            return [ev]
        return []

    def _pick(self, candidates: list[Replica], now: float) -> Replica:
        ready = [r for r in candidates if _admitting(r)] or \
            [r for r in candidates if _pressed(r) or now - r.current_start_s >= TPOT_PACE * self._tightest_tpot(r)] \
            or candidates
        vtime = self.state.vtime
        return min(ready, key=lambda r: (vtime.get(r.spec.replica_id, 0.0), r.spec.replica_id))

    def _weight(self, r: Replica) -> float:
        return (GUEST_WEIGHT if r.spec.guest else 1.0) / self._tightest_tpot(r)

    def _tightest_tpot(self, r: Replica) -> float:
        """The tightest TPOT target among the requests the executor would hold: those running
        and as many waiting as there are free KV slots (the service leases no more)."""
        classes = self.sla_classes
        standard = classes["standard"]
        running = [live for lives in r.finishing.values() for live in lives]
        running += r.prefilling
        free = max(0, r.spec.max_num_seqs - len(running))
        held = running + list(islice(r.waiting, free))
        tpot = min((classes.get(live.spec.sla_class, standard).tbt_s for live in held), default=math.inf)
        return DEFAULT_TPOT_S if tpot == math.inf else max(MIN_TPOT_S, tpot)


def _running(r: Replica) -> int:
    return len(r.prefilling) + r.num_decodes


def _admitting(r: Replica) -> bool:
    return bool(r.waiting or r.preempted) and _running(r) < r.spec.max_num_seqs


def _pressed(r: Replica) -> bool:
    return bool(r.waiting or r.preempted) or 2 * _running(r) >= r.spec.max_num_seqs
