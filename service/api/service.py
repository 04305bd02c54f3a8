"""The live service: state, persistence and the scheduler loop behind the HTTP API.

:class:`LiveService` owns the Neo4j driver, the :class:`~service.api.state.LiveState` mirror,
the batched :class:`~service.api.writer.GmgWriter` and three background tasks: lease expiry,
the scheduler (the same ``Scheduler.step`` as replay, run on arrivals and completions at most
every ``schedule_interval_s``, in a worker thread on a snapshot), and replica clean-up. At start
it rebuilds its state from Neo4j: tenants (with key hashes), models, and every request that was
accepted and not finished, queued again (leases of the previous process are void).

Placement: ``container`` gives each served model whole devices in proportion to its tenant's
weight (the same allocation as replay; when there are more models than devices, the extra ones
share the least loaded device). ``slice`` starts from the same homes and adds guest replicas
where the what-if simulator says it pays, found by the Cypher candidate-slot search on the GMG.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from service.api.keys import ExecutorPools
from service.api.live_view import LIVE_CLUSTER, LiveClusterView, LiveSnapshot, live_spec
from service.api.metrics import LiveMetrics
from service.api.settings import ServiceSettings
from service.api.state import (
    TERMINAL,
    LiveModel,
    LiveRequest,
    LiveState,
    Write,
)
from service.api.writer import GmgWriter
from service.core.placement import TenantDemand, candidate_groups, container_replicas, make_placement_policy
from service.core.queue import make_queue_policy
from service.core.scheduler import Decision, DeviceInfo, ReplicaInfo, Scheduler
from service.core.slot import InputDep, Slot, SlotQuery
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.graph.catalog import QueryCatalog
from service.graph.connection import open_driver
from service.graph.repository import GraphRepository
from service.models.family import MODEL_CONFIGS
from service.sim.iteration import weight_bytes

log = logging.getLogger("slicesched.service")

RECOVER_FINISHED_S = 24 * 3600.0  # finished requests loaded at start (for status queries)


class Signal:
    """Wakes every waiter at once: waiters take :meth:`event` before checking the state, so a
    notification between the check and the wait is never missed."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def event(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


class LiveService:
    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.started = time.monotonic()
        self.state = LiveState(make_queue_policy(settings.queue), clock=time.monotonic, wall=time.time,
                               lease_ttl_s=settings.lease_ttl_s, max_attempts=settings.max_attempts,
                               max_batch=settings.max_batch)
        self.metrics = LiveMetrics(self.state)
        self.pools = ExecutorPools(settings.executor_key, settings.executor_kinds)  # executor keys
        self.driver: Any = None
        self.repo: GraphRepository | None = None
        self.writer: GmgWriter | None = None
        placement = make_placement_policy(settings.placement)
        if settings.placement == "slice":
            placement.find_devices = self._cypher_candidates  # type: ignore[union-attr]
        self.scheduler = Scheduler(self.state.policy, placement)
        self.work = Signal()  # notified when leases may be granted
        self.changed = asyncio.Event()  # set on arrivals and completions (the scheduler's trigger)
        self.decisions: list[str] = []
        self.step_s: list[float] = []  # wall time of each scheduler step (what-ifs included)
        self._tasks: list[asyncio.Task[None]] = []
        self._busy_mark: dict[str, tuple[float, float]] = {}
        self._replan_lock = asyncio.Lock()  # one re-plan at a time: they rewrite the same devices

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.driver = await asyncio.to_thread(open_driver, self.settings.neo4j)
        self.repo = GraphRepository(self.driver, QueryCatalog.load(), database=self.settings.neo4j.database)
        await asyncio.to_thread(self.repo.apply_schema)
        await self._recover()
        self.pools.recover(await asyncio.to_thread(self.repo.live_executor_pools))
        self.writer = GmgWriter(self.repo, on_lag=self.metrics.write_lag.observe)
        await asyncio.to_thread(self.writer.warm_up)
        self.writer.start()
        self._tasks = [asyncio.create_task(self._expiry_loop(), name="lease-expiry"),
                       asyncio.create_task(self._schedule_loop(), name="scheduler"),
                       asyncio.create_task(self._retention_loop(), name="retention")]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.writer is not None:
            await self.writer.close()
        if self.driver is not None:
            await asyncio.to_thread(self.driver.close)

    async def _recover(self) -> None:
        repo = self.repo
        assert repo is not None
        for t in await asyncio.to_thread(repo.live_tenants):
            self.state.add_tenant(t["tenant_id"], t["sla_class"] or "standard", float(t["weight"] or 1.0),
                                  int(t["priority"] or 0), t["key_hash"])
        for m in await asyncio.to_thread(repo.live_models):
            self.state.add_model(LiveModel(m["tenant_id"], m["model_id"], m["family"], int(m["seed"]),
                                           int(m["replicas"] or 1)))
        rows = await asyncio.to_thread(repo.live_requests, time.time() - RECOVER_FINISHED_S)
        requeued = 0
        for row in rows:
            req = LiveRequest(row["uid"], row["tenant_id"], row["model_id"], list(row["prompt"]),
                              int(row["max_tokens"]), row["sla_class"], int(row["token_budget"]),
                              float(row["arrival"]), status=row["status"], attempts=int(row.get("attempts") or 0),
                              output_tokens=list(row.get("output_tokens") or []), queued_s=row.get("queued_s"),
                              ttft_s=row.get("ttft_s"), e2e_s=row.get("e2e_s"), finished_at=row.get("finished_at"),
                              error=row.get("error"))
            if req.model_uid not in self.state.models:
                continue
            requeued += req.status not in TERMINAL
            self.state.accept(req)
        if rows:
            log.info("recovered %d requests from Neo4j (%d queued again)", len(rows), requeued)
        self.work.notify()

    # ---- persistence -------------------------------------------------------------------------
    def persist(self, writes: Iterable[Write]) -> None:
        assert self.writer is not None
        self.writer.submit(writes)

    async def accept_requests(self, reqs: list[LiveRequest]) -> None:
        """Write the requests to Neo4j (one transaction), then queue them: an answered request
        is never lost, and a failed write accepts none."""
        assert self.repo is not None
        await asyncio.to_thread(self.repo.create_requests, [r.row() for r in reqs])
        for req in reqs:
            self.state.accept(req)
            self.metrics.arrived(req)
        self.work.notify()
        self.changed.set()

    # ---- placement: homes --------------------------------------------------------------------
    async def replan(self) -> None:
        """(Re)compute home replicas after models or devices changed, and put the weights in the GMG."""
        async with self._replan_lock:
            await self._replan()

    async def _replan(self) -> None:
        state = self.state
        devices = sorted(state.devices.values(), key=lambda d: d.device_id)
        models = sorted(state.models.values(), key=lambda m: m.uid)
        spec = live_spec([(d.device_id, d.executor_id, d.kind, d.mem_bytes) for d in devices])
        wanted = self._homes(spec, models, devices) if devices and models else []
        current = {r.replica_id: r for r in state.replicas.values() if not r.guest and not r.pinned}
        keep = set()
        for uid, device_ids in wanted:
            rid = f"{uid}@{'+'.join(device_ids)}"
            keep.add(rid)
            if rid in current:
                current[rid].draining = False
            else:
                state.add_replica(uid, device_ids, guest=False)
        for rid, r in current.items():
            if rid not in keep:
                r.draining = True
        assert self.repo is not None
        if devices:
            await asyncio.to_thread(self.repo.apply_cluster, spec)
        await self._write_residence()
        self.work.notify()

    def _homes(self, spec: ClusterSpec, models: list[LiveModel], devices: list[Any]) -> list[tuple[str, tuple[str, ...]]]:
        demands = [TenantDemand(m.uid, m.family, self.state.tenant(m.tenant_id).weight) for m in models]
        fits = min(len(models), len(devices))
        by_weight = sorted(demands, key=lambda t: (-t.device_s_per_s, t.tenant_id))
        placed = container_replicas(spec, by_weight[:fits], weight_bytes=lambda f: weight_bytes(MODEL_CONFIGS[f]),
                                    reserve_bytes=lambda f: 0)
        out = [(uid, devs) for uid, _, devs in placed]
        load: dict[str, int] = {d.device_id: 0 for d in devices}
        for _, devs in out:
            for d in devs:
                load[d] += 1
        for extra in by_weight[fits:]:  # more models than devices: share the least loaded one
            d = min(load, key=lambda x: (load[x], x))
            load[d] += 1
            out.append((extra.tenant_id, (d,)))
            log.warning("%s shares device %s: more models than devices", extra.tenant_id, d)
        return out

    async def _write_residence(self) -> None:
        assert self.repo is not None
        on: dict[str, list[str]] = {uid: [] for uid in self.state.models}
        for r in self.state.replicas.values():
            on.setdefault(r.model_uid, []).extend(r.device_ids)
        for uid, device_ids in on.items():
            await asyncio.to_thread(self.repo.set_weight_residence, uid, sorted(set(device_ids)), cluster=LIVE_CLUSTER)

    # ---- placement: the scheduler loop ---------------------------------------------------------
    def snapshot(self, window_s: float = 20.0) -> LiveSnapshot:
        """The live state as the scheduler sees it. Compute units: an executor daemon runs one
        iteration at a time, so all its devices share one compute stream; the scheduler sees one
        device per executor (memory: its devices together) and a placement on it is put on the
        executor's device with the most free memory."""
        state = self.state
        now_wall = time.time()
        now = time.monotonic()
        family = {uid: m.family for uid, m in state.models.items()}
        unit_of = {d.device_id: d.executor_id for d in state.devices.values()}
        replicas = []
        first_home: dict[str, str] = {}
        for r in sorted(state.replicas.values(), key=lambda r: (r.guest, r.replica_id)):
            if not r.guest and not r.draining:
                first_home.setdefault(r.model_uid, r.replica_id)
        for r in state.replicas.values():
            waiting = state.waiting(r.model_uid) if first_home.get(r.model_uid) == r.replica_id else 0
            idle = 0.0 if r.leases else now - r.last_active
            units = tuple(dict.fromkeys(unit_of[d] for d in r.device_ids))
            replicas.append(ReplicaInfo(r.replica_id, r.model_uid, family[r.model_uid], units, waiting,
                                        len(r.leases), r.guest, r.draining, idle))
        devices, rows, devices_of = [], [], {}
        for e in state.executors.values():
            members = [state.devices[d] for d in e.device_ids if d in state.devices]
            if not members:
                continue
            devices_of[e.executor_id] = tuple(d.device_id for d in members)
            hosting = tuple(r.replica_id for r in state.replicas.values() if set(r.device_ids) & set(e.device_ids))
            devices.append(DeviceInfo(e.executor_id, e.executor_id, sum(state.free_bytes(d.device_id) for d in members),
                                      self._utilisation(e.executor_id), hosting))
            rows.append((e.executor_id, e.executor_id, members[0].kind, sum(d.mem_bytes for d in members)))
        start = now_wall - window_s
        recent = []
        for req in state.requests.values():
            if (req.status in TERMINAL and req.arrival < start) or req.status == "cancelled":
                continue
            recent.append(RequestSpec(req.request_id, req.model_uid, family[req.model_uid],
                                      max(0.0, req.arrival - start), len(req.prompt), req.token_budget,
                                      req.sla_class))
        return LiveSnapshot(now - self.started, live_spec(rows), tuple(replicas), tuple(devices),
                            {r.replica_id: r.max_batch for r in state.replicas.values()}, tuple(recent), window_s,
                            dict(state.iteration_s), devices_of)

    def _utilisation(self, executor_id: str) -> float:
        e = self.state.executors[executor_id]
        now = time.monotonic()
        t0, b0 = self._busy_mark.get(executor_id, (self.started, 0.0))
        return min(1.0, (e.busy_s - b0) / (now - t0) / max(1, len(e.device_ids))) if now > t0 else 0.0

    def _cypher_candidates(self, view: LiveClusterView, tenant: str, k: int) -> list[tuple[str, ...]]:
        """Candidate units from the Cypher candidate-slot search over the live devices in the GMG:
        the query runs on real devices; each answer counts for its executor (compute unit)."""
        assert self.repo is not None
        repo = self.repo
        devices_of = view.snap.devices_of
        unit_of = {d: u for u, ds in devices_of.items() for d in ds}

        def search(q: SlotQuery) -> list[Slot]:
            deps = tuple(InputDep(devices_of[d.device_id][0] if d.device_id in devices_of else d.device_id,
                                  d.end_s, d.bytes) for d in q.input_deps)
            slots = repo.find_candidate_slots(replace(q, input_deps=deps, k=max(q.k, len(unit_of))))
            best: dict[str, Slot] = {}
            for slot in slots:  # best first
                unit = unit_of.get(slot.device_id)
                if unit is not None and unit not in best:
                    best[unit] = replace(slot, device_id=unit)
            return list(best.values())[: q.k]

        return candidate_groups(view, tenant, k, search=search)

    async def _schedule_loop(self) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            if self.settings.placement == "slice" and self.state.replicas:
                try:
                    await self.step()
                except Exception: # a failed step must not stop the service
                    log.exception("scheduler step failed")
            await asyncio.sleep(self.settings.schedule_interval_s)

    async def step(self) -> Decision:
        """One ``Scheduler.step`` on a snapshot (in a worker thread), then apply its decision."""
        snap = self.snapshot()
        for eid, e in self.state.executors.items():
            self._busy_mark[eid] = (time.monotonic(), e.busy_s)
        started = time.perf_counter()
        decision = await asyncio.to_thread(lambda: self.scheduler.step(snap.now_s, LiveClusterView(snap)))
        self.step_s.append(time.perf_counter() - started)
        return await self.apply(decision)

    async def apply(self, decision: Decision) -> Decision:
        state = self.state
        for rid in decision.drain:
            if rid in state.replicas:
                state.replicas[rid].draining = True
        for change in decision.add:  # device ids are compute units (executors): pick their roomiest device
            real = []
            for unit in change.device_ids:
                members = [d for d in state.devices.values() if d.executor_id == unit]
                if members:
                    real.append(max(members, key=lambda d: (state.free_bytes(d.device_id), d.device_id)).device_id)
            if change.tenant_id in state.models and len(real) == len(change.device_ids):
                state.add_replica(change.tenant_id, tuple(real), guest=True)
        for note in decision.notes:
            log.info("scheduler: %s", note)
            self.decisions.append(note)
        if decision.add or decision.drain:
            await self._write_residence()
            self.work.notify()
        return decision

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(min(0.5, self.settings.lease_ttl_s / 4))
            executors = len(self.state.executors)
            writes = self.state.expire()
            removed = self.state.remove_drained()
            if writes:
                self.persist(writes)
                self.work.notify()
            if len(self.state.executors) != executors:  # a silent executor was dropped: new homes
                log.warning("executor(s) silent for %.0fs dropped; re-planning homes", 3 * self.settings.lease_ttl_s)
                await self.replan()
            elif removed:
                await self._write_residence()
            if writes or removed:
                self.changed.set()

    def policy_what_if(self, horizon_s: float) -> dict[str, Any]:
        """What one step of the slice policy would decide on the current state (nothing applied)."""
        from service.core.placement import SlicePlacementPolicy

        policy = SlicePlacementPolicy(horizon_s=horizon_s, find_devices=self._cypher_candidates)  # type: ignore[arg-type]
        snap = self.snapshot()
        decision = policy.step(snap.now_s, LiveClusterView(snap))
        return {"placement": "slice", "horizon_s": horizon_s, "whatifs": decision.num_whatifs,
                "add": [{"model": c.tenant_id, "compute_units": list(c.device_ids)} for c in decision.add],
                "drain": decision.drain, "notes": decision.notes}

    async def _retention_loop(self) -> None:
        """Bounded retention: live Slices older than ``slice_retention_s`` go, every 10 minutes."""
        assert self.repo is not None
        while True:
            try:
                deleted = await asyncio.to_thread(self.repo.delete_old_live_slices,
                                                  time.time() - self.settings.slice_retention_s)
                if deleted:
                    log.info("retention: deleted %d live slices", deleted)
            except Exception:  # a failed clean-up is retried next time
                log.exception("retention clean-up failed")
            await asyncio.sleep(600.0)

    # ---- what-if (admin) -------------------------------------------------------------------------
    def what_if(self, model_uid: str, device_ids: tuple[str, ...], horizon_s: float) -> dict[str, Any]:
        from service.core.scheduler import ReplicaChange

        if model_uid not in self.state.models:
            raise InvalidInputError(f"no model {model_uid!r}")
        unknown = [d for d in device_ids if d not in self.state.devices]
        if unknown or not device_ids:
            raise InvalidInputError(f"unknown devices {unknown or 'none given'}")
        units = tuple(dict.fromkeys(self.state.devices[d].executor_id for d in device_ids))
        view = LiveClusterView(self.snapshot())
        baseline, changed = view.what_if(ReplicaChange(model_uid, self.state.models[model_uid].family, units),
                                         horizon_s)

        def plain(o: Any) -> dict[str, Any] | None:
            return None if o is None else {"output_tokens": o.output_tokens, "violations_by_model": o.violations_by_tenant,
                                           "memory_violations": o.memory_violations, "peak_bytes": o.peak_bytes}

        return {"horizon_s": horizon_s, "compute_units": list(units), "baseline": plain(baseline),
                "with_change": plain(changed), "feasible": changed is not None}

