"""The live service's placement loop: the scheduler's step on a snapshot of the live state
(guest replicas judged by the what-if simulator, with Cypher candidate slots), its decision
applied, and the what-if answers of the admin API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from service.core.cost import CostModel
from service.core.placement import candidate_groups
from service.core.policies import make_placement_policy
from service.core.reason import DecisionReason
from service.core.scheduler import ClusterView, Decision, DeviceInfo, ReplicaChange, ReplicaInfo, Scheduler
from service.core.slicing import plans_at_quantum
from service.core.slot import InputDep, Slot, SlotQuery
from service.domain.audit import SCHEDULER
from service.domain.error import InvalidInputError, InvariantError
from service.domain.request import RequestSpec, RequestStatus
from service.live.audit import AuditLog, decision_details, replica_model
from service.live.homes import HomePlanner
from service.live.metrics import LiveMetrics
from service.live.neo4j_gate import Neo4jGate
from service.live.notify import Signal
from service.live.records import TERMINAL, LiveReplica
from service.live.state import LiveState
from service.live.view import LiveClusterView, LiveSnapshot, live_spec
from service.sim.replica import SliceStage
from service.sim.sla import SLA_CLASSES

log = logging.getLogger("slicesched.service")
MAX_WINDOW_S = 120.0  # how far back the what-if mirror replays arrivals, at most
SLICE_STEP_WHATIF_S = 5.0  # wall seconds of what-ifs in one step of the live slice policy (the loop stays responsive)


class SchedulingLoop:
    """``Scheduler.step`` on the live state (a part of :class:`~service.live.service.LiveService`,
    its parts passed in): the placement ``placement`` (container, replica or slice) with its
    candidates from the Cypher slot search, the what-ifs priced by ``cost_model()`` (the one in
    force: a retrain swaps it), decisions applied, audited and published."""

    def __init__(self, placement: str, gate: Neo4jGate, state: LiveState, metrics: LiveMetrics, audit: AuditLog,
                 homes: HomePlanner, work: Signal, changed: asyncio.Event, cost_model: Callable[[], CostModel], *,
                 headroom_utilisation: float | None = None, confirm_drains: int = 0) -> None:
        self.placement = placement
        self.gate, self.state, self.metrics, self.audit, self.homes = gate, state, metrics, audit, homes
        self.work = work  # notified when leases may be granted
        self.changed = changed  # set on arrivals and completions (the scheduler's trigger)
        self.cost_model = cost_model  # the what-if mirror's
        self.started = time.monotonic()
        params: dict[str, Any] = {}
        if placement == "replica":
            params = {"headroom_utilisation": headroom_utilisation or None, "confirm_drains": confirm_drains}
        elif placement == "slice":  # sliced plans from the Cypher slots; a step's what-ifs bounded in wall time
            params = {"find_plans": self._cypher_plans, "whatif_wall_s": SLICE_STEP_WHATIF_S, "clock": time.monotonic}
        self.scheduler = Scheduler(make_placement_policy(placement, find_devices=self._cypher_candidates, **params))
        self.decisions: list[str] = []
        self.decision_reasons: list[dict[str, Any]] = []  # the last 50, each DecisionReason.as_dict()
        self.step_status: dict[str, Any] | None = None  # the last step's Status.as_dict() (None: no step yet)
        self.step_s: list[float] = []  # wall time of each scheduler step (what-ifs included)
        self._busy_mark: dict[str, tuple[float, float]] = {}
        self._first_arrival: dict[str, float] = {}  # model uid -> epoch s of its first request seen (load forecasts)

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
        plans: dict[str, tuple[SliceStage, ...]] = {}
        first_home: dict[str, str] = {}
        for r in sorted(state.replicas.values(), key=lambda r: (r.guest, r.replica_id)):
            if not r.guest and not r.draining:
                first_home.setdefault(r.model_uid, r.replica_id)
        share = self._wait_slack_shares(now_wall)
        for r in state.replicas.values():
            first = first_home.get(r.model_uid) == r.replica_id
            waiting = state.waiting(r.model_uid) if first else 0
            idle = 0.0 if r.leases else now - r.last_active
            units = tuple(dict.fromkeys(unit_of[d] for d in r.device_ids))
            replicas.append(ReplicaInfo(r.replica_id, state.models[r.model_uid].tenant_id, r.model_uid,
                                        family[r.model_uid], units, waiting, len(r.leases), r.guest, r.draining, idle,
                                        share.get(r.model_uid, 1.0) if first else 1.0, yields_to_owners=r.yields))
            if r.plan:  # a sliced guest: its cut on compute units (inclusive layer ranges, as the policy plans)
                plans[r.replica_id] = tuple(SliceStage(unit_of[d], s, e - 1) for d, s, e in r.plan)
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
        # The window reaches back to the oldest unfinished request (up to MAX_WINDOW_S), so that a
        # backlog keeps its true age in the mirror: a request queued for a minute is late there too.
        start = now_wall - window_s
        unfinished = [req.arrival for req in state.requests.values() if req.status not in TERMINAL]
        if unfinished:
            start = max(now_wall - MAX_WINDOW_S, min(start, min(unfinished)))
        window_s = now_wall - start
        recent = []
        pending: set[str] = set()
        sla_classes = dict(SLA_CLASSES)  # and the targets of requests with their own (x-slo-* headers)
        first_seen = self._first_arrival  # remembered: finished requests leave the state
        for req in state.requests.values():
            first_seen[req.model_uid] = min(first_seen.get(req.model_uid, math.inf), req.arrival)
            if (req.status in TERMINAL and req.arrival < start) or req.status == RequestStatus.CANCELLED:
                continue
            sla = req.sla
            sla_classes.setdefault(sla.name, sla)
            recent.append(RequestSpec(req.request_id, req.model_uid, family[req.model_uid],
                                      max(0.0, req.arrival - start), len(req.prompt), req.token_budget, sla.name))
            if req.status not in TERMINAL:
                pending.add(req.request_id)
        return LiveSnapshot(now - self.started, live_spec(rows), tuple(replicas), tuple(devices),
                            {r.replica_id: r.max_batch for r in state.replicas.values()}, tuple(recent), window_s,
                            window_start_wall=start, iteration_s=dict(state.iteration_s), devices_of=devices_of,
                            sla_classes=sla_classes, configs={m.family: m.config for m in state.models.values()},
                            pending=frozenset(pending),
                            seen_since={m: t - start for m, t in first_seen.items() if m in state.models},
                            plans=plans)

    def _wait_slack_shares(self, now_wall: float) -> dict[str, float]:
        """Per model, the least TTFT allowance left among its queued requests, as a share of
        their targets (what decides whether a guest must yield to the model's backlog)."""
        shares: dict[str, float] = {}
        for req in self.state.queued():
            target = req.sla.ttft_target_s(len(req.prompt))
            left = (target - (now_wall - req.arrival)) / target if target > 0 else -math.inf
            shares[req.model_uid] = min(shares.get(req.model_uid, math.inf), left)
        return shares

    def _utilisation(self, executor_id: str) -> float:
        """The executor's busy share since the last step: an executor runs one iteration at a
        time whatever its devices, so its busy seconds over the wall time (not over its devices)."""
        e = self.state.executors[executor_id]
        now = time.monotonic()
        t0, b0 = self._busy_mark.get(executor_id, (self.started, 0.0))
        return min(1.0, (e.busy_s - b0) / (now - t0)) if now > t0 else 0.0

    def cypher_slots(self, view: LiveClusterView, q: SlotQuery) -> list[Slot]:
        """The Cypher candidate-slot search over the live devices in the GMG for a query of the
        view's (compute units, mirror seconds): producers' units become their first device, the
        query runs on real devices, and each answer counts for its unit (best first). The GMG's
        live busy windows are epoch seconds (running leases: :mod:`service.domain.slice_state`),
        so times cross at the snapshot's offset, ``window_start_wall``, both ways."""
        if self.gate.repo is None:
            raise InvariantError("the Cypher candidate search needs the GMG")
        devices_of = view.snap.devices_of
        epoch = view.snap.window_start_wall
        deps = tuple(InputDep(devices_of[d.device_id][0] if d.device_id in devices_of else d.device_id,
                              d.end_s + epoch, d.bytes) for d in q.input_deps)
        n_devices = sum(len(ds) for ds in devices_of.values())
        slots = self.gate.repo.slots.find_candidate_slots(replace(q, now_s=q.now_s + epoch, input_deps=deps,
                                                       k=max(q.k, n_devices)))
        best: dict[str, Slot] = {}
        for slot in slots:  # best first
            unit = view.unit_of(slot.device_id)
            if unit is not None and unit not in best:
                best[unit] = replace(slot, device_id=unit, start_s=slot.start_s - epoch)
        return list(best.values())[: q.k]

    def _cypher_candidates(self, view: ClusterView, model_uid: str, k: int) -> list[tuple[str, ...]]:
        """Candidate units for a guest replica from the Cypher candidate-slot search (:meth:`cypher_slots`)."""
        if not isinstance(view, LiveClusterView):
            raise InvariantError("the Cypher candidate search needs a live view")
        return candidate_groups(view, model_uid, k, search=lambda q: self.cypher_slots(view, q))

    def _cypher_plans(self, view: ClusterView, model_uid: str, layers_per_slice: int, k: int
                      ) -> list[tuple[tuple[str, int, int], ...]]:
        """Sliced plans for the ``slice`` policy, each slice's slot from the Cypher candidate-slot
        search over the live busy windows (:meth:`cypher_slots`)."""
        if not isinstance(view, LiveClusterView):
            raise InvariantError("the Cypher candidate search needs a live view")
        return plans_at_quantum(view, model_uid, layers_per_slice, k, search=lambda q: self.cypher_slots(view, q))

    async def tick(self) -> None:
        """Wait (up to a few seconds) for arrivals or completions, then step the replica policy."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), 5.0)
        if not self.changed.is_set():
            return
        self.changed.clear()
        if self.placement in ("replica", "slice") and self.state.replicas:
            await self.step()

    async def step(self) -> Decision:
        """One ``Scheduler.step`` on a snapshot (in a worker thread), then apply its decision."""
        snap = self.snapshot()
        for eid, e in self.state.executors.items():
            self._busy_mark[eid] = (time.monotonic(), e.busy_s)
        started = time.perf_counter()
        view = LiveClusterView(snap, cost_model=self.cost_model(), target=self.state,
                               on_what_if=self.metrics.what_if_timer("scheduler"))
        decision = await self.gate.in_thread(self.scheduler.step, snap.now_s, view)
        self.step_s.append(time.perf_counter() - started)
        self.metrics.step_done(self.scheduler.name, self.step_s[-1])
        applied = view.apply(decision)  # on the event loop: the state is not shared with worker threads
        replicas = self.state.replicas
        for rid in applied.added:  # a sliced guest in words: its layers, where, and whose gaps it runs in
            if replicas[rid].plan:
                decision.reasons.append(self.sliced_reason(replicas[rid]))
        self.metrics.placed(self.scheduler.name, "add", (replicas[rid] for rid in applied.added))
        self.metrics.placed(self.scheduler.name, "drain", (replicas[rid] for rid in applied.drained))
        if decision.add or decision.drain:  # a step that changes nothing is no decision to audit
            self.audit.record(SCHEDULER, "placement.decision", "placement",
                              details=decision_details(self.scheduler.name, decision, applied),
                              models={*(c.model_uid for c in decision.add), *map(replica_model, decision.drain)})
        return await self._applied(decision)

    async def _applied(self, decision: Decision) -> Decision:
        """Log an applied decision and publish what changed (leases, the GMG)."""
        for reason in decision.reasons:
            note = reason.text()
            log.info("scheduler: %s", note)
            self.decisions.append(note)
            self.decision_reasons.append(reason.as_dict())
        del self.decision_reasons[:-50]
        self.step_status = None if decision.status is None else decision.status.as_dict()
        if decision.add or decision.drain:
            self.work.notify()
            await self.homes.cluster_written()
        return decision

    def sliced_in_words(self, replica: LiveReplica) -> str:
        """``sliced: acme/m layers 0-11 on exec-b/cpu:1, layers 12-23 on exec-a/cpu:0, in
        initech's idle windows (owner priority)``: the owners are the tenants whose own replicas
        are on those devices."""
        return self.sliced_reason(replica).text()

    def sliced_reason(self, replica: LiveReplica) -> DecisionReason:
        """Where an applied sliced guest's layers run (``plan``: device, first layer, end layer),
        in whose idle windows (``owners``: the tenants whose own replicas are on those devices),
        and whether it yields to them (``yields``); :meth:`sliced_in_words` says it."""
        state = self.state
        devices = {d for d, _, _ in replica.plan}
        owners = sorted({state.models[r.model_uid].tenant_id for r in state.replicas.values()
                         if not r.guest and devices.intersection(r.device_ids)})
        return DecisionReason("sliced", replica.model_uid, state.models[replica.model_uid].tenant_id,
                              tuple(dict.fromkeys(d for d, _, _ in replica.plan)), replica.replica_id,
                              {"plan": [[d, s, e] for d, s, e in replica.plan], "owners": owners,
                               "yields": replica.yields})

    def policy_what_if(self, horizon_s: float) -> dict[str, Any]:
        """What one step of the replica policy would decide on the current state (nothing applied)."""
        policy = make_placement_policy("replica", find_devices=self._cypher_candidates, horizon_s=horizon_s)
        snap = self.snapshot()
        decision = policy.step(snap.now_s, LiveClusterView(snap, cost_model=self.cost_model(),
                                                           on_what_if=self.metrics.what_if_timer("admin")))
        return {"placement": "replica", "horizon_s": horizon_s, "whatifs": decision.num_whatifs,
                "add": [{"model": c.model_uid, "compute_units": list(c.device_ids)} for c in decision.add],
                "drain": decision.drain, "notes": list(decision.notes),
                "reasons": [r.as_dict() for r in decision.reasons],
                "status": None if decision.status is None else decision.status.as_dict()}

    def what_if(self, model_uid: str, device_ids: tuple[str, ...], horizon_s: float) -> dict[str, Any]:
        if model_uid not in self.state.models:
            raise InvalidInputError(f"no model {model_uid!r}")
        unknown = [d for d in device_ids if d not in self.state.devices]
        if unknown or not device_ids:
            raise InvalidInputError(f"unknown devices {unknown or 'none given'}")
        view = LiveClusterView(self.snapshot(), cost_model=self.cost_model(),
                               on_what_if=self.metrics.what_if_timer("admin"))
        units = tuple(dict.fromkeys(u for d in device_ids if (u := view.unit_of(d)) is not None))
        baseline, changed = view.what_if(ReplicaChange(model_uid, self.state.models[model_uid].family, units),
                                         horizon_s)

        def plain(o: Any) -> dict[str, Any] | None:
            return None if o is None else {"output_tokens": o.output_tokens, "violations_by_model": o.violations_by_tenant,
                                           "memory_violations": o.memory_violations, "peak_bytes": o.peak_bytes}

        return {"horizon_s": horizon_s, "compute_units": list(units), "baseline": plain(baseline),
                "with_change": plain(changed), "feasible": changed is not None}
