"""The live service's requests and leases: intake, queues and the lease state machine.

One lease is one request to run on one replica (a placement of a tenant's model on one or more
devices). A replica holds at most ``max_batch`` leases at once (its KV slots), so the order in
which leases are granted is the admission order, and that order is the queue policy's. A lease
expires unless renewed (executor heartbeats renew all its leases); an expired lease's request
goes back to its queue; a completion is accepted only for a live lease, and a request's result
is recorded once. Each mutation returns the :class:`~service.live.records.Write` rows the GMG must
receive (the caller persists them: a new request synchronously before answering, everything
else batched); ``on_end`` observes every request's end (done, cancelled, failed or adopted from
Neo4j), once it is applied. What is registered and where (tenants, models, executors, replicas) is the
:class:`~service.live.registry.Registry`'s.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from service.core.admission import admit
from service.core.budget import BudgetCalibrator
from service.core.queue import QueuedRequest, QueuePolicy, RequestQueue
from service.domain.error import ConflictError, InvalidInputError, NotFoundError
from service.domain.request import RequestStatus
from service.domain.slice_state import SliceState
from service.domain.wire import Completion
from service.live.records import TERMINAL, Lease, LiveReplica, LiveRequest, Write
from service.live.registry import Registry
from service.sim.sla import SLA_CLASSES

#: The counter each end of a lease adds to: one per Slice end state in the GMG.
LEASE_END_COUNTERS = {SliceState.DONE: "leases_completed", SliceState.EXPIRED: "leases_expired",
                      SliceState.FAILED: "leases_failed", SliceState.CANCELLED: "leases_cancelled"}

#: The longest a lease is expected to run, for its busy window in the GMG until it ends: an
#: estimate from a few early observations cannot block a device for longer than this.
MAX_EXPECTED_LEASE_S = 600.0


class LeaseBook:
    def __init__(self, registry: Registry, policy: QueuePolicy, *, clock: Callable[[], float],
                 wall: Callable[[], float], lease_ttl_s: float = 10.0, max_attempts: int = 3) -> None:
        self.registry = registry
        self.policy = policy
        self.clock = clock
        self.wall = wall
        self.lease_ttl_s = lease_ttl_s
        self.max_attempts = max_attempts
        self.requests: dict[str, LiveRequest] = {}
        self.by_idempotency: dict[tuple[str, str], str] = {}  # (tenant, Idempotency-Key) -> request id
        self.leases: dict[str, Lease] = {}
        self.queues: dict[str, RequestQueue[str]] = {}  # model uid -> queued request ids
        self.served: dict[str, float] = {}  # output tokens per tenant (fair share)
        self.calibrator = BudgetCalibrator()
        self.iteration_s: dict[str, float] = {}  # family -> measured mean iteration time (EWMA)
        # leases_granted counts Slices created; each end counts once, under LEASE_END_COUNTERS[state]
        self.counters: dict[str, int] = {"leases_granted": 0, **dict.fromkeys(LEASE_END_COUNTERS.values(), 0),
                                         "completions_rejected": 0, "slice_observations": 0}
        self._lease_ids = itertools.count(1)
        self._lease_prefix = secrets.token_hex(3)  # lease ids never repeat across restarts
        self.on_end: Callable[[LiveRequest], None] = lambda req: None  # a request ended (observer)
        # a lease ended: its request and the device-seconds it held (observer: quota usage)
        self.on_lease_end: Callable[[LiveRequest, float], None] = lambda req, device_s: None
        # renewals that moved running leases' expected ends (Writes of kind slice_extend: the GMG's busy windows)
        self.on_extend: Callable[[list[Write]], None] = lambda writes: None

    # ---- requests ----------------------------------------------------------------------------
    def open_queue(self, model_uid: str) -> None:
        """The queue of a newly registered model."""
        self.queues.setdefault(model_uid, RequestQueue(self.policy))

    def new_request(self, tenant_id: str, model_id: str, prompt: list[int], max_tokens: int,
                    sla_class: str | None) -> LiveRequest:
        """Validate and build a request (not yet accepted: :meth:`accept` after it is persisted)."""
        model = self.registry.model(tenant_id, model_id)
        sla = sla_class or self.registry.tenant(tenant_id).sla_class
        if sla not in SLA_CLASSES:
            raise InvalidInputError(f"unknown SLA class {sla!r} (known: {', '.join(SLA_CLASSES)})", culprit="sla_class")
        config = model.config
        if not prompt:
            raise InvalidInputError("the prompt is empty", culprit="prompt")
        bad = [t for t in prompt if not (0 <= t < config.vocab_size)]
        if bad:
            raise InvalidInputError(f"token id {bad[0]} is outside the model's vocabulary [0, {config.vocab_size})",
                                    culprit="prompt")
        if not (1 <= max_tokens <= config.max_seq_len):
            raise InvalidInputError(f"max_tokens must be in [1, {config.max_seq_len}], got {max_tokens}",
                                    culprit="max_tokens")
        if len(prompt) + max_tokens > config.max_seq_len:
            raise InvalidInputError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
                                    f"model's context of {config.max_seq_len} tokens", culprit="max_tokens")
        rid = f"{tenant_id}-{secrets.token_hex(6)}"
        return LiveRequest(rid, tenant_id, model_id, list(prompt), max_tokens, sla,
                           self.calibrator.budget(model.uid, max_tokens), self.wall())

    def accept(self, req: LiveRequest) -> None:
        """Take a persisted request into memory and queue it (also used by restart recovery)."""
        self.requests[req.request_id] = req
        if req.idempotency_key:
            self.by_idempotency[(req.tenant_id, req.idempotency_key)] = req.request_id
        if req.status not in TERMINAL:
            req.status, req.lease_id = RequestStatus.QUEUED, None
            self._enqueue(req)

    def _enqueue(self, req: LiveRequest) -> None:
        tenant = self.registry.tenants.get(req.tenant_id)
        queue = self.queues.setdefault(req.model_uid, RequestQueue(self.policy))
        queue.push(QueuedRequest(req.request_id, req.tenant_id, req.model_uid, req.arrival, len(req.prompt),
                                 req.token_budget, priority=req.priority if req.priority is not None
                                 else tenant.priority if tenant else 0,
                                 weight=tenant.weight if tenant else 1.0, true_output_tokens=req.max_tokens,
                                 deadline_s=req.arrival + req.sla.deadline_s(len(req.prompt), req.token_budget)),
                   req.request_id)

    def request(self, request_id: str, tenant_id: str | None) -> LiveRequest:
        """The request, if ``tenant_id`` (None: admin) may see it; else NotFound (no leak)."""
        req = self.requests.get(request_id)
        if req is None or (tenant_id is not None and req.tenant_id != tenant_id):
            raise NotFoundError(f"no request {request_id!r}")
        return req

    def begin_finish(self, req: LiveRequest) -> None:
        """Claim the request's end (a completion or a cancel about to be written): until
        :meth:`abandon_finish` or the end itself, nothing else may end it or expire its lease."""
        if req.status in TERMINAL:
            raise ConflictError(f"request {req.request_id} is already {req.status}")
        if req.finishing:
            raise ConflictError(f"request {req.request_id} is finishing (a completion or cancel is being written)")
        req.finishing = True

    def abandon_finish(self, req: LiveRequest) -> None:
        req.finishing = False

    def cancel_row(self, req: LiveRequest) -> dict[str, Any]:
        """The durable form of a cancel (for ``finish_requests``), before :meth:`cancel` applies it."""
        row = {**req.update_row(), "status": RequestStatus.CANCELLED.value, "finished_at": self.wall()}
        end = None
        if req.lease_id is not None:
            end = {"uid": req.lease_id, "state": SliceState.CANCELLED.value, "end_s": row["finished_at"],
                   "end_wall": row["finished_at"], "busy_s": None, "iterations": None, "peak_bytes": None}
        return {"request": row, "slice_end": end}

    def cancel(self, req: LiveRequest) -> list[Write]:
        if req.status in TERMINAL:
            raise ConflictError(f"request {req.request_id} is already {req.status}")
        req.finishing = False
        writes = []
        if req.lease_id is not None:
            writes += self._end_lease(req.lease_id, SliceState.CANCELLED)
        req.status, req.finished_at = RequestStatus.CANCELLED, self.wall()
        self.on_end(req)
        return [*writes, Write("request", req.update_row())]

    def set_policy(self, policy: QueuePolicy) -> None:
        """Order every model's queue by ``policy`` from now on. Only between runs: with a request
        queued or leased, a ``ConflictError`` and nothing changes (keys already given would mix two
        orders). The fair-share counts start again from zero."""
        busy = sum(1 for r in self.requests.values() if r.status in (RequestStatus.QUEUED, RequestStatus.LEASED))
        if busy or self.leases:
            raise ConflictError(f"{busy} request(s) are queued or leased: switch the queue policy when none is")
        self.policy = policy
        for uid in self.queues:  # in place: the state shares this dict
            self.queues[uid] = RequestQueue(policy)
        self.served.clear()

    def waiting(self, model_uid: str) -> int:
        queue = self.queues.get(model_uid)
        return sum(1 for rid in queue if self.requests[rid].status == RequestStatus.QUEUED) if queue is not None else 0


    # ---- executors ---------------------------------------------------------------------------
    def register_executor(self, executor_id: str, host_id: str, devices: list[tuple[str, str, int]],
                          stage_url: str | None = None) -> list[Write]:
        """(Re-)register an executor with ``(local name, kind, mem_bytes)`` per device."""
        writes = self.drop_executor(executor_id) if executor_id in self.registry.executors else []
        self.registry.add_executor(executor_id, host_id, devices, stage_url)
        return writes

    def heartbeat(self, executor_id: str, busy_s: float, running: Iterable[str]) -> tuple[list[str], list[str]]:
        """Renew the executor's leases that it reports holding (running, or finished with the
        completion not yet accepted); returns ``(renewed, cancel)`` lease ids. A lease it no
        longer reports is left to expire: its result was dropped or will never come."""
        e = self.registry.executor(executor_id)
        now = self.clock()
        e.last_seen = now
        e.busy_s = max(e.busy_s, busy_s)
        reported = set(running)
        renewed = []
        for lid in reported & e.leases:
            self.leases[lid].expires_at = now + self.lease_ttl_s
            renewed.append(lid)
        self._extend(renewed)
        return sorted(renewed), self.stale(executor_id, reported)

    def _extend(self, lease_ids: Iterable[str]) -> None:
        """Renewed leases whose renewal runs past their expected end: the end moves to the
        renewal's horizon (now + the lease's time to live, epoch seconds), and the Slice's window
        with it (a ``slice_extend`` write to :attr:`on_extend`), so that a lease running past its
        estimate keeps its devices busy for the candidate-slot search until it ends or expires.
        A window is never shortened; a renewal inside the estimate writes nothing."""
        horizon = self.wall() + self.lease_ttl_s
        writes = []
        for lid in lease_ids:
            lease = self.leases[lid]
            if lease.expected_end_wall < horizon:
                lease.expected_end_wall = horizon
                writes.append(Write("slice_extend", {"uid": lid, "end_s": horizon}))
        if writes:
            self.on_extend(writes)

    def stale(self, executor_id: str, reported: Iterable[str]) -> list[str]:
        """Of the leases an executor reports, those it should stop: no longer its live leases
        (cancelled, expired, or granted by a previous process). Their results would be refused."""
        e = self.registry.executor(executor_id)
        return sorted(set(reported) - e.leases)


    def drop_executor(self, executor_id: str) -> list[Write]:
        """An executor leaves (or is presumed dead): its leases go back, its replicas go away."""
        e = self.registry.executors.get(executor_id)
        if e is None:
            return []
        writes: list[Write] = []
        for lid in sorted(e.leases):
            if self.requests[self.leases[lid].request_id].finishing:
                continue  # its completion is being written: that decides
            writes += self._end_lease(lid, SliceState.EXPIRED, requeue=True)
        self.registry.remove_executor(executor_id)
        return writes

    # ---- leases --------------------------------------------------------------------------------
    def grant(self, executor_id: str, max_leases: int, ready: Collection[str] | None = None
              ) -> list[tuple[Lease, LiveReplica, LiveRequest]]:
        """Up to ``max_leases`` leases for replicas on the executor's devices: home replicas
        before guests, and within those the queue policy's next request of each model.

        ``ready``: the replicas the executor says it has built. One not among them holds at most
        one lease (the one that has it built) until it is: its other requests stay queued, where
        a replica already running may take them (measured live: a new guest leased eight
        requests at once, which waited 3 s for its model to load while acme's home had room)."""
        e = self.registry.executor(executor_id)
        now = self.clock()
        e.last_seen = now
        replicas = [r for r in self.registry.replicas_led_on(e.device_ids)
                    if not r.draining and self.registry.reachable(r, executor_id)]
        out: list[tuple[Lease, LiveReplica, LiveRequest]] = []
        progress = True
        while len(out) < max_leases and progress:
            progress = False
            for r in replicas:  # one lease per replica per round: replicas share the executor fairly
                room = r.max_batch if ready is None or r.replica_id in ready else 1
                if len(out) >= max_leases or len(r.leases) >= room or (r.yields and self._peers_have_room(r)):
                    continue
                req = self._admit_one(r, lambda: len(out) < max_leases)
                if req is None:
                    continue
                wall = self.wall()
                lease = Lease(f"L{self._lease_prefix}-{next(self._lease_ids)}", req.request_id, r.replica_id,
                              executor_id, now, now + self.lease_ttl_s, wall, wall + self.expected_run_s(req))
                self.leases[lease.lease_id] = lease
                r.leases.add(lease.lease_id)
                r.last_active = now
                e.leases.add(lease.lease_id)
                req.status, req.lease_id = RequestStatus.LEASED, lease.lease_id
                req.attempts += 1
                self.counters["leases_granted"] += 1
                out.append((lease, r, req))
                progress = True
        return out

    def takers(self, model_uids: Iterable[str], requests: int) -> tuple[set[str], int]:
        """Whom to wake for ``requests`` new queued requests of these models, in one pass over
        their replicas: the executors that could lease one now (each leads a replica of one of
        them that is not draining and has a free batch slot; a grant's wake-up goes to these, not
        to every waiting executor) and how many of them to wake: one per request, plus one per
        sliced guest (a guest takes only what its peers leave, so the peers woken first may leave
        it work that no other wake-up would bring it)."""
        out: set[str] = set()
        count = requests
        for uid in set(model_uids):
            for r in self.registry.replicas_of_model(uid):
                if r.draining:
                    continue
                count += r.yields
                owner = self.registry.devices.get(r.device_ids[0])
                if owner is not None and len(r.leases) < r.max_batch:
                    out.add(owner.executor_id)
        return out, count

    def _peers_have_room(self, r: LiveReplica) -> bool:
        """Whether another replica of the sliced guest ``r``'s model that does not yield has a
        free batch slot: a sliced guest takes only its tenant's overflow (what no such replica
        can start now), as the simulator's sliced guest admits only what its peers left waiting,
        so a request runs in the owners' gaps only when it would otherwise wait."""
        return any(not o.draining and not o.yields and len(o.leases) < o.max_batch
                   for o in self.registry.replicas_of_model(r.model_uid) if o is not r)

    def _admit_one(self, r: LiveReplica, room: Callable[[], bool]) -> LiveRequest | None:
        """The queue policy's next queued request of the replica's model, if the replica has a
        free batch slot and ``room()`` (shared admission, :func:`service.core.admission.admit`;
        ids of requests no longer queued, e.g. cancelled, are dropped on the way)."""
        queue = self.queues.get(r.model_uid)
        if not queue:
            return None

        def fits(rid: str) -> bool:
            return self.requests[rid].status != RequestStatus.QUEUED or (len(r.leases) < r.max_batch and room())

        for rid in admit(queue, self.served, fits):
            req = self.requests[rid]
            if req.status == RequestStatus.QUEUED:
                return req
        return None

    def lease(self, lease_id: str, executor_id: str | None = None) -> Lease:
        lease = self.leases.get(lease_id)
        if lease is None or (executor_id is not None and lease.executor_id != executor_id):
            raise ConflictError(f"lease {lease_id} is not live (expired, cancelled, completed or unknown)")
        return lease

    def renew(self, lease_id: str) -> float:
        lease = self.lease(lease_id)
        lease.expires_at = self.clock() + self.lease_ttl_s
        self._extend([lease_id])
        return self.lease_ttl_s

    def completion_row(self, executor_id: str, c: Completion) -> dict[str, Any]:
        """Check a completion against its live lease and claim the request's end; returns the
        row that makes it durable (``complete_leases``: the result and the done Slice in one
        transaction). Apply it with :meth:`complete` once written, or :meth:`abandon_finish`."""
        lease = self.lease(c.lease_id, executor_id)
        req = self.requests[lease.request_id]
        if req.status != RequestStatus.LEASED or req.lease_id != c.lease_id:
            raise ConflictError(f"lease {c.lease_id} no longer holds request {req.request_id}")
        n = len(c.output_tokens)
        if n != req.max_tokens and not (0 < n < req.max_tokens and
                                        c.output_tokens[-1] in self.registry.models[req.model_uid].tokenizer.stop_ids):
            raise InvalidInputError(f"lease {c.lease_id}: {n} output tokens, the request asked for "
                                    f"{req.max_tokens} (fewer only when the last is a stop id)")
        self.begin_finish(req)
        wall = self.wall()
        waited = lease.granted_wall - req.arrival
        result = {**req.update_row(), "status": RequestStatus.DONE.value, "output_tokens": list(c.output_tokens), "finished_at": wall,
                  "queued_s": waited + c.queued_s, "ttft_s": waited + c.ttft_s, "e2e_s": waited + c.e2e_s}
        replica = self.registry.replicas.get(lease.replica_id)
        devices = list(replica.device_ids) if replica is not None else []
        return {"request": result,
                "slice": {"uid": lease.lease_id, "tenant_id": req.tenant_id, "model_uid": req.model_uid,
                          "device_ids": devices, "executor_id": lease.executor_id, "start_s": lease.granted_wall,
                          "end_s": wall, "start_wall": lease.granted_wall, "end_wall": wall, "busy_s": c.busy_s,
                          "iterations": c.iterations, "peak_bytes": c.peak_bytes}}

    def adopt(self, req: LiveRequest, stored: dict[str, Any]) -> list[Write]:
        """Take a request's final state from Neo4j where memory disagrees (a commit whose answer
        was lost): a lease still holding it ends (expired; its work is moot) and nothing runs it again."""
        writes: list[Write] = []
        if req.lease_id is not None and req.lease_id in self.leases:
            writes += self._end_lease(req.lease_id, SliceState.EXPIRED)
        req.finishing, req.lease_id = False, None
        req.status = RequestStatus(stored["status"])
        req.output_tokens = list(stored.get("output_tokens") or [])
        req.queued_s, req.ttft_s, req.e2e_s = stored.get("queued_s"), stored.get("ttft_s"), stored.get("e2e_s")
        req.finished_at, req.error = stored.get("finished_at"), stored.get("error")
        if req.status in TERMINAL:
            self.on_end(req)
        return writes

    def complete(self, c: Completion, row: dict[str, Any]) -> list[Write]:
        """Apply a completion already written (``row`` from :meth:`completion_row`): the request
        is done with the result that Neo4j holds. Returns the GMG rows of what the executor
        measured (:meth:`observations`), soft state for the batched writer."""
        lease = self.leases[c.lease_id]
        req = self.requests[lease.request_id]
        observed = self.observations(lease, req, c, float(row["request"]["finished_at"]))
        self._end_lease(c.lease_id, SliceState.DONE, observed=c)
        result = row["request"]
        req.finishing = False
        req.status, req.output_tokens, req.finished_at = RequestStatus.DONE, list(c.output_tokens), result["finished_at"]
        req.queued_s, req.ttft_s, req.e2e_s = result["queued_s"], result["ttft_s"], result["e2e_s"]
        self.served[req.tenant_id] = self.served.get(req.tenant_id, 0.0) + len(c.output_tokens)
        self.calibrator.observe(req.model_uid, req.max_tokens, req.token_budget, len(c.output_tokens))
        if c.iterations > 0 and c.busy_s > 0:
            family = self.registry.models[req.model_uid].family
            mean = c.busy_s / c.iterations
            old = self.iteration_s.get(family)
            self.iteration_s[family] = mean if old is None else old + 0.1 * (mean - old)
        self.on_end(req)
        return observed

    def observations(self, lease: Lease, req: LiveRequest, c: Completion, wall: float) -> list[Write]:
        """The request's prefill, and the decode iteration its executor timed, as slice
        observations (``record_slice_observations``): one row per stage of the lease the executor
        timed, with the device it ran on (the GMG's id), the layers it covers, the batch features
        and its latency. Prefill: one sequence of the prompt's tokens; the first stage's row is
        the lease's own Slice, another stage's a Slice of its own (``<lease>/<stage>``). Decode:
        ``decode_batch`` sequences of one new token each over ``decode_context`` cached tokens,
        on Slices of their own (``<lease>/d<stage>``). A stage count that does not match the
        placement records nothing of that phase."""
        replica = self.registry.replicas.get(lease.replica_id)
        model = self.registry.models.get(req.model_uid)
        if replica is None or model is None or not (c.prefill_stage_s or c.decode_stage_s):
            return []
        stages = self.registry.stages(replica, lease.executor_id, model.config.n_layers)
        phases = [("prefill", c.prefill_stage_s, 1, len(req.prompt), 0)]
        if c.decode_batch > 0 and c.decode_context > 0:
            phases.append(("decode", c.decode_stage_s, c.decode_batch, c.decode_batch, c.decode_context))
        out = []
        for phase, times, batch, tokens, context in phases:
            if len(stages) != len(times):
                continue
            for i, (stage, seconds) in enumerate(zip(stages, times, strict=True)):
                if seconds is None or not seconds > 0 or stage.global_device_id is None:
                    continue
                uid = (lease.lease_id if i == 0 else f"{lease.lease_id}/{i}") if phase == "prefill" \
                    else f"{lease.lease_id}/d{i}"
                out.append(Write("observation", {
                    "uid": uid, "tenant_id": req.tenant_id, "family": model.family,
                    "device_id": stage.global_device_id, "layer_start": stage.start, "layer_end": stage.end,
                    "batch": batch, "tokens": tokens, "context": context, "phase": phase,
                    "latency_s": float(seconds), "observed_wall": wall}))
        self.counters["slice_observations"] += len(out)
        return out

    def fail_row(self, lease_id: str, executor_id: str | None, reason: str) -> dict[str, Any] | None:
        """The durable form of a failed lease when it ends its request (out of attempts: the
        row for ``finish_requests``, and the request's end is claimed); None when the request
        goes back to its queue (soft state, batched)."""
        lease = self.lease(lease_id, executor_id)
        req = self.requests[lease.request_id]
        if req.finishing:
            raise ConflictError(f"request {req.request_id} is finishing")
        if req.attempts < self.max_attempts:
            return None
        self.begin_finish(req)
        wall = self.wall()
        return {"request": {**req.update_row(), "status": RequestStatus.FAILED.value, "error": reason[:500], "finished_at": wall},
                "slice_end": {"uid": lease_id, "state": SliceState.FAILED.value, "end_s": wall, "end_wall": wall,
                              "busy_s": None, "iterations": None, "peak_bytes": None}}

    def fail(self, lease_id: str, executor_id: str | None, reason: str) -> list[Write]:
        lease = self.lease(lease_id, executor_id)
        req = self.requests[lease.request_id]
        req.finishing = False
        writes = self._end_lease(lease_id, SliceState.FAILED, requeue=req.attempts < self.max_attempts)
        if req.status == RequestStatus.LEASED:  # not requeued: out of attempts
            req.status, req.error, req.finished_at = RequestStatus.FAILED, reason[:500], self.wall()
            self.on_end(req)
        return [*writes, Write("request", req.update_row())]

    def expire(self) -> list[Write]:
        """Expire leases past their time and executors silent for three lease lifetimes."""
        now = self.clock()
        writes: list[Write] = []
        for lid in [lid for lid, lease in self.leases.items()
                    if lease.expires_at <= now and not self.requests[lease.request_id].finishing]:
            writes += self._end_lease(lid, SliceState.EXPIRED, requeue=True)
        for eid in [eid for eid, e in self.registry.executors.items() if now - e.last_seen > 3 * self.lease_ttl_s]:
            writes += self.drop_executor(eid)
        return writes

    def _end_lease(self, lease_id: str, state: SliceState, *, requeue: bool = False,
                   observed: Completion | None = None) -> list[Write]:
        lease = self.leases.pop(lease_id)
        self.counters[LEASE_END_COUNTERS[state]] += 1  # here, the one place a lease ends: counters equal the GMG
        replica = self.registry.replicas.get(lease.replica_id)
        if replica is not None:
            replica.leases.discard(lease_id)
            replica.last_active = self.clock()
        executor = self.registry.executors.get(lease.executor_id)
        if executor is not None:
            executor.leases.discard(lease_id)
        req = self.requests[lease.request_id]
        held_s = observed.busy_s if observed is not None else max(0.0, self.wall() - lease.granted_wall)
        self.on_lease_end(req, held_s * (len(replica.device_ids) if replica is not None else 1))
        writes = [self.slice_row(lease, state, observed)]
        if requeue and req.status == RequestStatus.LEASED and req.lease_id == lease_id:
            req.status, req.lease_id = RequestStatus.QUEUED, None
            self._enqueue(req)
            writes.append(Write("request", req.update_row()))
        return writes

    def slice_row(self, lease: Lease, state: SliceState, observed: Completion | None = None) -> Write:
        """A lease as a Slice: created whole, ``running``, when granted (its window from the grant
        to its expected end, epoch seconds), then only its end is written (the window's real
        end), with the executor's observation when it completed (busy seconds, iterations, peak
        bytes)."""
        if state != SliceState.RUNNING:
            wall = self.wall()
            row: dict[str, Any] = {"uid": lease.lease_id, "state": state.value, "end_s": wall, "end_wall": wall,
                                   "busy_s": None, "iterations": None, "peak_bytes": None}
            if observed is not None:
                row.update(busy_s=observed.busy_s, iterations=observed.iterations, peak_bytes=observed.peak_bytes)
            return Write("slice_end", row)
        replica = self.registry.replicas[lease.replica_id]
        req = self.requests[lease.request_id]
        return Write("slice_new", {"uid": lease.lease_id, "tenant_id": req.tenant_id, "model_uid": req.model_uid,
                                   "request_uid": req.request_id, "device_ids": list(replica.device_ids),
                                   "executor_id": lease.executor_id, "state": state.value,
                                   "start_s": lease.granted_wall, "end_s": lease.expected_end_wall,
                                   "start_wall": lease.granted_wall, "end_wall": None})

    def expected_run_s(self, req: LiveRequest) -> float:
        """How long a lease of ``req`` is expected to hold its replica (its busy window in the GMG
        until it ends): ``max_tokens`` iterations (a prefill, then a decode per further token) at
        the mean iteration time measured for the model's family; before any measurement, the
        lease's time to live (its executor must renew it by then, so a device is not shown busy
        for longer on a guess). At most :data:`MAX_EXPECTED_LEASE_S`. A renewal past this end
        moves it (:meth:`_extend`): a lease that outruns its estimate stays busy in the GMG."""
        measured = self.iteration_s.get(self.registry.models[req.model_uid].family)
        estimate = req.max_tokens * measured if measured else self.lease_ttl_s
        return min(estimate, MAX_EXPECTED_LEASE_S)

    # ---- views -------------------------------------------------------------------------------
    def queued(self) -> Iterator[LiveRequest]:
        return (r for r in self.requests.values() if r.status == RequestStatus.QUEUED)

    def in_flight(self) -> Iterable[LiveRequest]:
        return (r for r in self.requests.values() if r.status == RequestStatus.LEASED)
