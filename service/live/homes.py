"""Home replicas of the live service: each served model's whole compute units (container placement),
re-planned when models or devices change, and the cluster's shape written to the GMG."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from service.core.placement import TenantDemand, container_replicas
from service.domain.audit import SCHEDULER
from service.domain.error import DatabaseUnavailableError, InvalidInputError
from service.domain.model_config import MODEL_CONFIGS
from service.graph.repository import GraphRepository
from service.live.audit import AuditLog
from service.live.metrics import LiveMetrics
from service.live.notify import Signal
from service.live.records import LIVE_FAMILIES, LiveModel
from service.live.state import LiveState
from service.live.view import LIVE_CLUSTER, live_spec
from service.sim.iteration import weight_bytes

log = logging.getLogger("slicesched.service")


class HomePlanner:
    """Where each model lives by default: the live state's home replicas, re-planned when models
    or devices change, and the cluster's shape in the GMG. Composed into
    :class:`~service.live.service.LiveService`, its parts passed in: the state, the metrics and
    the audit log it reports to, ``db`` (a repository call through the Neo4j gate, failing fast
    while Neo4j is down), ``repo`` (the repository, once open) and ``work`` (notified when leases
    may be granted)."""

    def __init__(self, state: LiveState, metrics: LiveMetrics, audit: AuditLog, work: Signal,
                 db: Callable[..., Awaitable[Any]], repo: Callable[[], GraphRepository | None]) -> None:
        self.state, self.metrics, self.audit, self.work = state, metrics, audit, work
        self._db, self._repo = db, repo
        self.unplaced: dict[str, str] = {}  # model uid -> why the last re-plan found it no home
        self.gmg_dirty = False  # the cluster's devices and weights in the GMG await a re-write
        self._waiting: list[asyncio.Future[None]] = []  # re-plans whose cluster write has not begun
        self._flush: asyncio.Future[None] | None = None  # the cluster write in flight

    @staticmethod
    def check_devices(devices: list[tuple[str, str, int]]) -> None:
        """Refuse, before anything is registered, devices that could never host a model:
        ``(name, kind, mem_bytes)`` each."""
        smallest = min(weight_bytes(MODEL_CONFIGS[f]) for f in LIVE_FAMILIES)
        small = [name for name, _, mem in devices if mem < smallest]
        if small:
            raise InvalidInputError(f"device(s) {', '.join(small)} have less memory than the smallest runnable "
                                    f"model's weights ({smallest} bytes): nothing was registered")

    async def replan(self) -> None:
        """(Re)compute home replicas after models or devices changed, and put the weights in the
        GMG. A model that fits nowhere is reported in :attr:`unplaced`, never fails the re-plan;
        when Neo4j cannot take the cluster's new shape now, the watcher writes it later."""
        self._replan()
        await self.cluster_written()

    async def cluster_written(self) -> None:
        """Wait for a write of the cluster's shape that begins after now. One write covers every
        re-plan before it (a group commit): executors registering together (a node pool coming
        up) share writes, where each had rewritten the whole cluster in turn, a cost that grew
        with the square of the fleet (benchmarks/fleet.py)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        if self._flush is None:
            self._flush = asyncio.ensure_future(self._flush_cluster())
        await asyncio.shield(done)

    async def _flush_cluster(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                failure: BaseException | None = None
                try:
                    await self.write_cluster()
                except Exception as exc:  # each waiting re-plan answers with it
                    failure = exc
                for done in batch:
                    if done.done():
                        continue
                    if failure is None:
                        done.set_result(None)
                    else:
                        done.set_exception(failure)
        finally:
            self._flush = None

    def _replan(self) -> None:
        state = self.state
        devices = sorted(state.devices.values(), key=lambda d: d.device_id)
        models = sorted(state.models.values(), key=lambda m: m.uid)
        wanted = self._homes(models, devices) if devices and models else []
        current = {r.replica_id: r for r in state.replicas.values() if not r.guest and not r.pinned}
        keep = set()
        added, drained = [], []
        for uid, device_ids in wanted:
            rid = f"{uid}@{'+'.join(device_ids)}"
            keep.add(rid)
            if rid in current:
                current[rid].draining = False
            else:
                added.append(state.add_replica(uid, device_ids, guest=False))
        for rid, r in current.items():
            if rid not in keep and not r.draining:
                r.draining = True
                drained.append(r)
        self.metrics.placed("container", "add", added)
        self.metrics.placed("container", "drain", drained)
        if added or drained:
            self.audit.record(SCHEDULER, "placement.replan", "placement", models={r.model_uid for r in added + drained},
                              details={"policy": "container", "added": [r.replica_id for r in added],
                                       "drained": [r.replica_id for r in drained], "unplaced": dict(self.unplaced)})
        self.gmg_dirty = True
        self.work.notify()

    async def write_cluster(self) -> None:
        """The live devices and where each model's weights reside, into the GMG."""
        repo = self._repo()
        assert repo is not None
        self.gmg_dirty = False
        devices = sorted(self.state.devices.values(), key=lambda d: d.device_id)
        spec = live_spec([(d.device_id, d.executor_id, d.kind, d.mem_bytes) for d in devices])
        on: dict[str, list[str]] = {uid: [] for uid in self.state.models}
        for r in self.state.replicas.values():
            on.setdefault(r.model_uid, []).extend(r.device_ids)
        try:
            if devices:
                await self._db(repo.cluster.apply_cluster, spec)
            await self._db(repo.cluster.set_weight_residences, {uid: sorted(set(ids)) for uid, ids in on.items()},
                           cluster=LIVE_CLUSTER)
        except DatabaseUnavailableError:
            self.gmg_dirty = True  # the watcher writes it when Neo4j is back
            log.warning("the cluster's shape could not be written to the GMG now; it will be when Neo4j answers")

    def _homes(self, models: list[LiveModel], devices: list[Any]) -> list[tuple[str, tuple[str, ...]]]:
        """Home devices per model. A device too small for every model hosts none; a model whose
        weights fit no executor's devices is left out and reported; when whole-unit homes are
        impossible, each model gets the device with the most room that holds it."""
        unplaced: dict[str, str] = {}
        smallest = min(m.weight_bytes for m in models)
        usable = [d for d in devices if d.mem_bytes >= smallest]
        per_executor: dict[str, int] = {}
        for d in usable:
            per_executor[d.executor_id] = per_executor.get(d.executor_id, 0) + d.mem_bytes
        room = max(per_executor.values(), default=0)
        fitting = []
        for m in models:
            if m.weight_bytes > room:
                unplaced[m.uid] = (f"its weights ({m.weight_bytes / 2**20:.1f} MiB) fit on no executor's devices "
                                   f"(largest: {room / 2**20:.1f} MiB)")
            else:
                fitting.append(m)
        out: list[tuple[str, tuple[str, ...]]] = []
        if fitting:
            try:
                out = self._container_homes(fitting, usable)
            except InvalidInputError as exc:
                log.warning("whole-unit homes impossible (%s): each model on the roomiest device that holds it", exc)
                out = self._greedy_homes(fitting, usable, unplaced)
        for uid, why in unplaced.items():
            if self.unplaced.get(uid) != why:
                log.warning("model %s has no home: %s", uid, why)
        self.unplaced = unplaced
        return out

    def _container_homes(self, models: list[LiveModel], devices: list[Any]) -> list[tuple[str, tuple[str, ...]]]:
        weight = {m.uid: self.state.tenant(m.tenant_id).weight for m in models}
        return unit_homes([(m.uid, m.family, m.weight_bytes, weight[m.uid]) for m in models],
                          [(d.device_id, d.executor_id, d.kind, d.mem_bytes) for d in devices])

    @staticmethod
    def _greedy_homes(models: list[LiveModel], devices: list[Any],
                      unplaced: dict[str, str]) -> list[tuple[str, tuple[str, ...]]]:
        free = {d.device_id: d.mem_bytes for d in devices}
        out: list[tuple[str, tuple[str, ...]]] = []
        for m in sorted(models, key=lambda m: (-m.weight_bytes, m.uid)):
            best = max(free, key=lambda d: (free[d], d), default=None)
            if best is None or free[best] < m.weight_bytes:
                unplaced[m.uid] = f"no single device has room for its weights ({m.weight_bytes / 2**20:.1f} MiB)"
                continue
            free[best] -= m.weight_bytes
            out.append((m.uid, (best,)))
        return out


def unit_homes(models: Sequence[tuple[str, str, int, float]], devices: Sequence[tuple[str, str, str, int]]
               ) -> list[tuple[str, tuple[str, ...]]]:
    """Container homes over whole compute units, by offered work: ``(model uid, devices)`` per
    home replica, for ``models`` as ``(uid, family, weight bytes, offered work)`` and
    ``devices`` as ``(device_id, executor_id, kind, mem_bytes)``.

    An executor runs one iteration at a time, so it is one unit whatever its devices: two
    replicas of a model on one executor would only split its batches. Units are shared out by
    :func:`container_replicas` over a spec of one device per executor (its devices' memory
    together); with more models than units, each extra shares the unit with the least offered
    work. Inside a unit a model goes on the device with the most room left, or over all the
    executor's devices when no one device holds its weights. Raises :class:`InvalidInputError`
    where whole units cannot hold the models."""
    units: dict[str, list[tuple[str, str, str, int]]] = {}
    for d in devices:
        units.setdefault(d[1], []).append(d)
    unit_spec = live_spec([(eid, eid, ds[0][2], sum(d[3] for d in ds)) for eid, ds in sorted(units.items())])
    demands = [TenantDemand(uid, family, work) for uid, family, _, work in models]
    work_of = {t.tenant_id: t.device_s_per_s for t in demands}
    by_work = sorted(demands, key=lambda t: (-t.device_s_per_s, t.tenant_id))
    fits = min(len(models), len(units))
    sizes = {family: size for _, family, size, _ in models}
    placed = container_replicas(unit_spec, by_work[:fits], weight_bytes=sizes.__getitem__, reserve_bytes=lambda f: 0)
    on_unit = [(uid, eid) for uid, _, eids in placed for eid in eids]
    work = dict.fromkeys(units, 0.0)
    for uid, eid in on_unit:
        work[eid] += work_of[uid]
    for extra in by_work[fits:]:  # more models than units: share the one with least offered work
        eid = min(work, key=lambda e: (work[e], e))
        work[eid] += extra.device_s_per_s
        on_unit.append((extra.tenant_id, eid))
        log.warning("%s shares executor %s: more models than executors", extra.tenant_id, eid)
    size_of = {uid: size for uid, _, size, _ in models}
    free = {d[0]: d[3] for d in devices}
    out: list[tuple[str, tuple[str, ...]]] = []
    for uid, eid in sorted(on_unit, key=lambda p: (-size_of[p[0]], p)):  # big models first
        roomiest = max(units[eid], key=lambda d: (free[d[0]], d[0]))[0]
        chosen = (roomiest,) if free[roomiest] >= size_of[uid] else tuple(sorted(d[0] for d in units[eid]))
        for device_id in chosen:  # the executor's devices together hold what no one of them does (stages)
            free[device_id] -= size_of[uid] // len(chosen)
        out.append((uid, chosen))
    return out
