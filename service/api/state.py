"""The live service's in-memory state: tenants, models, replicas, requests, executors and leases.

One object, :class:`LiveState`, owned by the event loop of the API process (every mutation runs
there, so no locks). It is the mirror of the GMG the scheduler reads; Neo4j is the system of
record. Each mutation returns the :class:`Write` rows the GMG must receive (the caller persists
them: a new request synchronously before answering, everything else batched).

Leases: one lease is one request to run on one replica (a placement of a tenant's model on one
or more devices). A replica holds at most ``max_batch`` leases at once (its KV slots), so the
order in which leases are granted is the admission order, and that order is the queue
policy's. A lease expires unless renewed (executor heartbeats renew all its leases); an expired
lease's request goes back to its queue; a completion is accepted only for a live lease, and a
request's result is recorded once.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.core.admission import admit
from service.core.batching import LIVE_BATCHING
from service.core.queue import QueuedRequest, QueuePolicy, RequestQueue
from service.core.scheduler import Applied, Decision
from service.domain.error import ConflictError, InvalidInputError, NotFoundError
from service.domain.request import TERMINAL_STATUSES, RequestStatus
from service.models.family import MODEL_CONFIGS, ModelConfig
from service.sim.iteration import kv_bytes_per_token, weight_bytes
from service.sim.sla import SLA_CLASSES

LIVE_FAMILIES = tuple(name for name, c in MODEL_CONFIGS.items() if not c.shape_only)
TERMINAL = TERMINAL_STATUSES
#: A request's status values, as the API lists them: queued, leased, then the terminal ones sorted.
STATUSES = tuple(s.value for s in (RequestStatus.QUEUED, RequestStatus.LEASED, *sorted(TERMINAL)))
#: The counter each end of a lease adds to: one per Slice end state in the GMG.
LEASE_END_COUNTERS = {"done": "leases_completed", "expired": "leases_expired", "failed": "leases_failed",
                      "cancelled": "leases_cancelled"}


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(24)}"


@dataclass
class LiveTenant:
    tenant_id: str
    sla_class: str
    weight: float
    priority: int
    key_hash: str | None  # SHA-256 hex of the tenant's key; None: revoked


@dataclass
class LiveModel:
    tenant_id: str
    model_id: str
    family: str
    seed: int
    replicas: int  # home replicas wanted (container: whole devices)

    @property
    def uid(self) -> str:
        return f"{self.tenant_id}/{self.model_id}"

    @property
    def config(self) -> ModelConfig:
        return MODEL_CONFIGS[self.family]

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.config)


@dataclass
class LiveDevice:
    device_id: str  # "<executor_id>/<local device>", unique in the service
    local: str  # the executor's name for it ("cpu:0", "cuda:1")
    executor_id: str
    host_id: str
    kind: str
    mem_bytes: int


@dataclass
class LiveExecutor:
    executor_id: str
    host_id: str
    device_ids: list[str]
    last_seen: float
    leases: set[str] = field(default_factory=set)
    busy_s: float = 0.0  # sum of reported busy seconds (utilisation)
    stage_url: str | None = None  # its stage server: layers of replicas led from other executors


@dataclass
class LiveReplica:
    replica_id: str
    model_uid: str
    device_ids: tuple[str, ...]
    guest: bool
    max_batch: int
    leases: set[str] = field(default_factory=set)
    draining: bool = False
    last_active: float = 0.0
    pinned: bool = False  # placed by an admin: the home planner leaves it alone


@dataclass
class LiveRequest:
    request_id: str
    tenant_id: str
    model_id: str
    prompt: list[int]
    max_tokens: int
    sla_class: str
    token_budget: int
    arrival: float  # wall clock (epoch seconds)
    status: RequestStatus = RequestStatus.QUEUED
    attempts: int = 0
    lease_id: str | None = None
    output_tokens: list[int] = field(default_factory=list)
    queued_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    finished_at: float | None = None
    error: str | None = None
    idempotency_key: str | None = None  # the client's key: a retry with it returns this request
    body_sha: str | None = None  # digest of what was submitted under that key
    finishing: bool = False  # its end (completion or cancel) is being written: nothing else may end it

    @property
    def model_uid(self) -> str:
        return f"{self.tenant_id}/{self.model_id}"

    def public(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "tenant_id": self.tenant_id, "model_id": self.model_id,
                "status": self.status.value, "prompt_tokens": len(self.prompt), "max_tokens": self.max_tokens,
                "sla_class": self.sla_class, "token_budget": self.token_budget, "attempts": self.attempts,
                "output_tokens": list(self.output_tokens), "queued_s": self.queued_s, "ttft_s": self.ttft_s,
                "e2e_s": self.e2e_s, "arrival": self.arrival, "finished_at": self.finished_at, "error": self.error}

    def update_row(self) -> dict[str, Any]:
        """What changes after acceptance (the GMG writer's batched update)."""
        return {"uid": self.request_id, "status": self.status.value, "attempts": self.attempts,
                "output_tokens": self.output_tokens, "queued_s": self.queued_s, "ttft_s": self.ttft_s,
                "e2e_s": self.e2e_s, "finished_at": self.finished_at, "error": self.error}

    def row(self) -> dict[str, Any]:
        """Its GMG properties (the prompt included, so a restart can run it)."""
        return {"uid": self.request_id, "tenant_id": self.tenant_id, "model_uid": self.model_uid,
                "model_id": self.model_id, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "sla_class": self.sla_class, "token_budget": self.token_budget, "arrival": self.arrival,
                "status": self.status.value, "attempts": self.attempts, "output_tokens": self.output_tokens,
                "queued_s": self.queued_s, "ttft_s": self.ttft_s, "e2e_s": self.e2e_s,
                "finished_at": self.finished_at, "error": self.error,
                "idempotency_key": self.idempotency_key, "body_sha": self.body_sha}


@dataclass
class Lease:
    lease_id: str
    request_id: str
    replica_id: str
    executor_id: str
    granted_at: float  # monotonic
    expires_at: float  # monotonic
    granted_wall: float


@dataclass(frozen=True)
class Write:
    """A row for the GMG writer: ``kind`` names the batched query it joins."""

    kind: str  # "request" (a request's update) | "slice_new" (a granted lease) | "slice_end" (its end)
    row: dict[str, Any]


@dataclass
class Completion:
    lease_id: str
    output_tokens: list[int]
    queued_s: float
    ttft_s: float
    e2e_s: float
    iterations: int
    busy_s: float
    peak_bytes: int


class BudgetCalibrator:
    """Output-token budget at admission, calibrated online per (tenant, model).

    A request's budget is its ``max_tokens`` scaled by the running mean of observed output over
    ``max_tokens`` for its tenant's model (EWMA with ``alpha``; 1.0 before any observation).
    """

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.ratio: dict[str, float] = {}
        self.abs_errors: deque[float] = deque(maxlen=10_000)  # |budget - observed| of recent completions

    def budget(self, model_uid: str, max_tokens: int) -> int:
        return max(1, min(max_tokens, round(max_tokens * self.ratio.get(model_uid, 1.0))))

    def observe(self, model_uid: str, max_tokens: int, budget: int, output_tokens: int) -> None:
        self.abs_errors.append(abs(budget - output_tokens))
        r = self.ratio.get(model_uid, 1.0)
        self.ratio[model_uid] = r + self.alpha * (output_tokens / max_tokens - r)


class LiveState:
    def __init__(self, policy: QueuePolicy, *, clock: Callable[[], float], wall: Callable[[], float],
                 lease_ttl_s: float = 10.0, max_attempts: int = 3, max_batch: int = 8,
                 kv_reserve_tokens: int = LIVE_BATCHING.kv_reserve_tokens) -> None:
        self.policy = policy
        self.clock = clock
        self.wall = wall
        self.lease_ttl_s = lease_ttl_s
        self.max_attempts = max_attempts
        self.max_batch = max_batch
        self.kv_reserve_tokens = kv_reserve_tokens
        self.tenants: dict[str, LiveTenant] = {}
        self.by_key_hash: dict[str, str] = {}
        self.models: dict[str, LiveModel] = {}
        self.devices: dict[str, LiveDevice] = {}
        self.executors: dict[str, LiveExecutor] = {}
        self.replicas: dict[str, LiveReplica] = {}
        self.requests: dict[str, LiveRequest] = {}
        self.by_idempotency: dict[tuple[str, str], str] = {}  # (tenant, Idempotency-Key) -> request id
        self.leases: dict[str, Lease] = {}
        self.queues: dict[str, RequestQueue[str]] = {}  # model uid -> queued request ids
        self.served: dict[str, float] = {}  # output tokens per tenant (fair share)
        self.calibrator = BudgetCalibrator()
        self.iteration_s: dict[str, float] = {}  # family -> measured mean iteration time (EWMA)
        # leases_granted counts Slices created; each end counts once, under LEASE_END_COUNTERS[state]
        self.counters: dict[str, int] = {"leases_granted": 0, **dict.fromkeys(LEASE_END_COUNTERS.values(), 0),
                                         "completions_rejected": 0}
        self._lease_ids = itertools.count(1)
        self._lease_prefix = secrets.token_hex(3)  # lease ids never repeat across restarts

    # ---- tenants and models -------------------------------------------------------------------
    @staticmethod
    def check_tenant(sla_class: str, weight: float) -> None:
        if sla_class not in SLA_CLASSES:
            raise InvalidInputError(f"unknown SLA class {sla_class!r} (known: {', '.join(SLA_CLASSES)})")
        if not (0.0 < weight < math.inf):
            raise InvalidInputError(f"weight must be finite and > 0, got {weight}")

    def add_tenant(self, tenant_id: str, sla_class: str, weight: float, priority: int,
                   key_hash: str | None) -> LiveTenant:
        self.check_tenant(sla_class, weight)
        tenant = LiveTenant(tenant_id, sla_class, weight, priority, key_hash)
        self.tenants[tenant_id] = tenant
        if key_hash is not None:
            self.by_key_hash[key_hash] = tenant_id
        return tenant

    def set_tenant_key(self, tenant_id: str, key_hash: str | None) -> None:
        """A rotated (new hash) or revoked (``None``) key: the old one is refused from now on."""
        tenant = self.tenant(tenant_id)
        if tenant.key_hash is not None:
            self.by_key_hash.pop(tenant.key_hash, None)
        tenant.key_hash = key_hash
        if key_hash is not None:
            self.by_key_hash[key_hash] = tenant_id

    def tenant(self, tenant_id: str) -> LiveTenant:
        t = self.tenants.get(tenant_id)
        if t is None:
            raise NotFoundError(f"no tenant {tenant_id!r}")
        return t

    def check_new_model(self, tenant_id: str, model_id: str, family: str) -> None:
        self.tenant(tenant_id)
        if family not in LIVE_FAMILIES:
            raise InvalidInputError(f"unknown model family {family!r} (runnable: {', '.join(LIVE_FAMILIES)})")
        if f"{tenant_id}/{model_id}" in self.models:
            raise ConflictError(f"model {model_id!r} already exists for tenant {tenant_id!r}")

    def add_model(self, model: LiveModel) -> None:
        self.models[model.uid] = model
        self.queues.setdefault(model.uid, RequestQueue(self.policy))

    def model(self, tenant_id: str, model_id: str) -> LiveModel:
        m = self.models.get(f"{tenant_id}/{model_id}")
        if m is None:
            raise NotFoundError(f"no model {model_id!r}")
        return m

    # ---- requests ----------------------------------------------------------------------------
    def new_request(self, tenant_id: str, model_id: str, prompt: list[int], max_tokens: int,
                    sla_class: str | None) -> LiveRequest:
        """Validate and build a request (not yet accepted: :meth:`accept` after it is persisted)."""
        model = self.model(tenant_id, model_id)
        sla = sla_class or self.tenant(tenant_id).sla_class
        if sla not in SLA_CLASSES:
            raise InvalidInputError(f"unknown SLA class {sla!r} (known: {', '.join(SLA_CLASSES)})")
        config = model.config
        if not prompt:
            raise InvalidInputError("the prompt is empty")
        bad = [t for t in prompt if not (0 <= t < config.vocab_size)]
        if bad:
            raise InvalidInputError(f"token id {bad[0]} is outside the model's vocabulary [0, {config.vocab_size})")
        if not (1 <= max_tokens <= config.max_seq_len):
            raise InvalidInputError(f"max_tokens must be in [1, {config.max_seq_len}], got {max_tokens}")
        if len(prompt) + max_tokens > config.max_seq_len:
            raise InvalidInputError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
                                    f"model's context of {config.max_seq_len} tokens")
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
        tenant = self.tenants.get(req.tenant_id)
        queue = self.queues.setdefault(req.model_uid, RequestQueue(self.policy))
        queue.push(QueuedRequest(req.request_id, req.tenant_id, req.model_uid, req.arrival, len(req.prompt),
                                 req.token_budget, priority=tenant.priority if tenant else 0,
                                 weight=tenant.weight if tenant else 1.0, true_output_tokens=req.max_tokens),
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
            end = {"uid": req.lease_id, "state": "cancelled", "end_wall": row["finished_at"], "busy_s": None,
                   "iterations": None, "peak_bytes": None}
        return {"request": row, "slice_end": end}

    def cancel(self, req: LiveRequest) -> list[Write]:
        if req.status in TERMINAL:
            raise ConflictError(f"request {req.request_id} is already {req.status}")
        req.finishing = False
        writes = []
        if req.lease_id is not None:
            writes += self._end_lease(req.lease_id, "cancelled")
        req.status, req.finished_at = RequestStatus.CANCELLED, self.wall()
        return [*writes, Write("request", req.update_row())]

    def waiting(self, model_uid: str) -> int:
        queue = self.queues.get(model_uid)
        return sum(1 for rid in queue if self.requests[rid].status == RequestStatus.QUEUED) if queue is not None else 0

    # ---- executors ---------------------------------------------------------------------------
    def register_executor(self, executor_id: str, host_id: str, devices: list[tuple[str, str, int]],
                          stage_url: str | None = None) -> list[Write]:
        """(Re-)register an executor with ``(local name, kind, mem_bytes)`` per device."""
        writes = self.drop_executor(executor_id) if executor_id in self.executors else []
        ids = []
        for local, kind, mem in devices:
            device_id = f"{executor_id}/{local}"
            self.devices[device_id] = LiveDevice(device_id, local, executor_id, host_id, kind, mem)
            ids.append(device_id)
        self.executors[executor_id] = LiveExecutor(executor_id, host_id, ids, self.clock(), stage_url=stage_url)
        return writes

    def executor(self, executor_id: str) -> LiveExecutor:
        e = self.executors.get(executor_id)
        if e is None:
            raise NotFoundError(f"no executor {executor_id!r}: register first")
        return e

    def heartbeat(self, executor_id: str, busy_s: float, running: Iterable[str]) -> tuple[list[str], list[str]]:
        """Renew the executor's leases that it reports holding (running, or finished with the
        completion not yet accepted); returns ``(renewed, cancel)`` lease ids. A lease it no
        longer reports is left to expire: its result was dropped or will never come."""
        e = self.executor(executor_id)
        now = self.clock()
        e.last_seen = now
        e.busy_s = max(e.busy_s, busy_s)
        renewed = []
        for lid in set(running) & e.leases:
            self.leases[lid].expires_at = now + self.lease_ttl_s
            renewed.append(lid)
        cancel = [lid for lid in e.leases if self.requests[self.leases[lid].request_id].status != RequestStatus.LEASED]
        return sorted(renewed), sorted(cancel)

    def drop_executor(self, executor_id: str) -> list[Write]:
        """An executor leaves (or is presumed dead): its leases go back, its replicas go away."""
        e = self.executors.pop(executor_id, None)
        if e is None:
            return []
        writes: list[Write] = []
        for lid in sorted(e.leases):
            if self.requests[self.leases[lid].request_id].finishing:
                continue  # its completion is being written: that decides
            writes += self._end_lease(lid, "expired", requeue=True)
        for rid in [r.replica_id for r in self.replicas.values() if set(r.device_ids) & set(e.device_ids)]:
            self.replicas.pop(rid)
        for d in e.device_ids:
            self.devices.pop(d, None)
        return writes

    # ---- replicas ----------------------------------------------------------------------------
    def add_replica(self, model_uid: str, device_ids: tuple[str, ...], *, guest: bool,
                    pinned: bool = False) -> LiveReplica:
        rid = f"{model_uid}@{'+'.join(device_ids)}"
        replica = LiveReplica(rid, model_uid, device_ids, guest, self.max_batch, last_active=self.clock(),
                              pinned=pinned)
        self.replicas[rid] = replica
        return replica

    def apply(self, decision: Decision, devices_of: Mapping[str, tuple[str, ...]]) -> Applied:
        """Carry out a scheduler decision made on compute units (``devices_of``: unit -> its
        devices): drain, then add each guest replica on the roomiest device of each unit (a
        change whose model or units are gone is skipped)."""
        applied = Applied()
        for rid in decision.drain:
            if rid in self.replicas:
                self.replicas[rid].draining = True
                applied.drained.append(rid)
        for change in decision.add:
            real = [max(members, key=lambda d: (self.free_bytes(d), d))
                    for unit in change.device_ids
                    if (members := [d for d in devices_of.get(unit, ()) if d in self.devices])]
            if change.model_uid in self.models and len(real) == len(change.device_ids):
                applied.added.append(self.add_replica(change.model_uid, tuple(real), guest=True).replica_id)
            else:
                applied.skipped.append(change)
        return applied

    def kv_reserve_bytes(self, model: LiveModel) -> int:
        return self.kv_reserve_tokens * kv_bytes_per_token(model.config)

    def free_bytes(self, device_id: str) -> int:
        d = self.devices[device_id]
        used = 0
        for r in self.replicas.values():
            if device_id in r.device_ids:
                m = self.models[r.model_uid]
                used += (m.weight_bytes + self.kv_reserve_bytes(m)) // len(r.device_ids)
        return d.mem_bytes - used

    def remove_drained(self) -> bool:
        """Remove draining replicas that hold no lease; True if any went."""
        gone = [rid for rid, r in self.replicas.items() if r.draining and not r.leases]
        for rid in gone:
            del self.replicas[rid]
        return bool(gone)

    # ---- leases --------------------------------------------------------------------------------
    def grant(self, executor_id: str, max_leases: int) -> list[tuple[Lease, LiveReplica, LiveRequest]]:
        """Up to ``max_leases`` leases for replicas on the executor's devices: home replicas
        before guests, and within those the queue policy's next request of each model."""
        e = self.executor(executor_id)
        now = self.clock()
        e.last_seen = now
        mine = set(e.device_ids)
        replicas = sorted((r for r in self.replicas.values()
                           if not r.draining and r.device_ids[0] in mine and self.reachable(r, executor_id)),
                          key=lambda r: (r.guest, r.replica_id))
        out: list[tuple[Lease, LiveReplica, LiveRequest]] = []
        progress = True
        while len(out) < max_leases and progress:
            progress = False
            for r in replicas:  # one lease per replica per round: replicas share the executor fairly
                if len(out) >= max_leases or len(r.leases) >= r.max_batch:
                    continue
                req = self._admit_one(r, lambda: len(out) < max_leases)
                if req is None:
                    continue
                lease = Lease(f"L{self._lease_prefix}-{next(self._lease_ids)}", req.request_id, r.replica_id,
                              executor_id, now, now + self.lease_ttl_s, self.wall())
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

    def reachable(self, replica: LiveReplica, executor_id: str) -> bool:
        """Whether ``executor_id`` can lead the replica: every device is its own, or belongs to
        a live executor with a stage server (the layers there run over HTTP)."""
        for d in replica.device_ids:
            owner = self.devices.get(d)
            if owner is None:
                return False
            if owner.executor_id != executor_id and not self.executors[owner.executor_id].stage_url:
                return False
        return True

    def stages(self, replica: LiveReplica, executor_id: str, n_layers: int) -> list[dict[str, Any]]:
        """The lease's placement: layers split evenly over the replica's devices in order; a stage
        on another executor carries that executor's stage server URL."""
        n = len(replica.device_ids)
        bounds = [round(i * n_layers / n) for i in range(n + 1)]
        out = []
        for i, d in enumerate(replica.device_ids):
            device = self.devices[d]
            stage: dict[str, Any] = {"device_id": device.local, "global_device_id": d, "layers": [bounds[i], bounds[i + 1]]}
            if device.executor_id != executor_id:
                stage["url"] = self.executors[device.executor_id].stage_url
            out.append(stage)
        return out

    def _admit_one(self, r: LiveReplica, room: Callable[[], bool]) -> LiveRequest | None:
        """The queue policy's next queued request of the replica's model, if the replica has a
        free batch slot and ``room()`` (shared admission; ids of requests no longer queued,
        e.g. cancelled, are dropped on the way)."""
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
        return self.lease_ttl_s

    def completion_row(self, executor_id: str, c: Completion) -> dict[str, Any]:
        """Check a completion against its live lease and claim the request's end; returns the
        row that makes it durable (``complete_leases``: the result and the done Slice in one
        transaction). Apply it with :meth:`complete` once written, or :meth:`abandon_finish`."""
        lease = self.lease(c.lease_id, executor_id)
        req = self.requests[lease.request_id]
        if req.status != RequestStatus.LEASED or req.lease_id != c.lease_id:
            raise ConflictError(f"lease {c.lease_id} no longer holds request {req.request_id}")
        if len(c.output_tokens) != req.max_tokens:
            raise InvalidInputError(f"lease {c.lease_id}: {len(c.output_tokens)} output tokens, "
                                    f"the request asked for {req.max_tokens}")
        self.begin_finish(req)
        wall = self.wall()
        waited = lease.granted_wall - req.arrival
        result = {**req.update_row(), "status": RequestStatus.DONE.value, "output_tokens": list(c.output_tokens), "finished_at": wall,
                  "queued_s": waited + c.queued_s, "ttft_s": waited + c.ttft_s, "e2e_s": waited + c.e2e_s}
        replica = self.replicas.get(lease.replica_id)
        devices = list(replica.device_ids) if replica is not None else []
        return {"request": result,
                "slice": {"uid": lease.lease_id, "tenant_id": req.tenant_id, "model_uid": req.model_uid,
                          "device_ids": devices, "executor_id": lease.executor_id, "start_wall": lease.granted_wall,
                          "end_wall": wall, "busy_s": c.busy_s, "iterations": c.iterations,
                          "peak_bytes": c.peak_bytes}}

    def adopt(self, req: LiveRequest, stored: dict[str, Any]) -> list[Write]:
        """Take a request's final state from Neo4j where memory disagrees (a commit whose answer
        was lost): a lease still holding it ends (expired; its work is moot) and nothing runs it again."""
        writes: list[Write] = []
        if req.lease_id is not None and req.lease_id in self.leases:
            writes += self._end_lease(req.lease_id, "expired")
        req.finishing, req.lease_id = False, None
        req.status = RequestStatus(stored["status"])
        req.output_tokens = list(stored.get("output_tokens") or [])
        req.queued_s, req.ttft_s, req.e2e_s = stored.get("queued_s"), stored.get("ttft_s"), stored.get("e2e_s")
        req.finished_at, req.error = stored.get("finished_at"), stored.get("error")
        return writes

    def complete(self, c: Completion, row: dict[str, Any]) -> None:
        """Apply a completion already written (``row`` from :meth:`completion_row`): the request
        is done with the result that Neo4j holds."""
        lease = self.leases[c.lease_id]
        req = self.requests[lease.request_id]
        self._end_lease(c.lease_id, "done", observed=c)
        result = row["request"]
        req.finishing = False
        req.status, req.output_tokens, req.finished_at = RequestStatus.DONE, list(c.output_tokens), result["finished_at"]
        req.queued_s, req.ttft_s, req.e2e_s = result["queued_s"], result["ttft_s"], result["e2e_s"]
        self.served[req.tenant_id] = self.served.get(req.tenant_id, 0.0) + len(c.output_tokens)
        self.calibrator.observe(req.model_uid, req.max_tokens, req.token_budget, len(c.output_tokens))
        if c.iterations > 0 and c.busy_s > 0:
            family = self.models[req.model_uid].family
            mean = c.busy_s / c.iterations
            old = self.iteration_s.get(family)
            self.iteration_s[family] = mean if old is None else old + 0.1 * (mean - old)

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
                "slice_end": {"uid": lease_id, "state": "failed", "end_wall": wall, "busy_s": None,
                              "iterations": None, "peak_bytes": None}}

    def fail(self, lease_id: str, executor_id: str | None, reason: str) -> list[Write]:
        lease = self.lease(lease_id, executor_id)
        req = self.requests[lease.request_id]
        req.finishing = False
        writes = self._end_lease(lease_id, "failed", requeue=req.attempts < self.max_attempts)
        if req.status == RequestStatus.LEASED:  # not requeued: out of attempts
            req.status, req.error, req.finished_at = RequestStatus.FAILED, reason[:500], self.wall()
        return [*writes, Write("request", req.update_row())]

    def expire(self) -> list[Write]:
        """Expire leases past their time and executors silent for three lease lifetimes."""
        now = self.clock()
        writes: list[Write] = []
        for lid in [lid for lid, lease in self.leases.items()
                    if lease.expires_at <= now and not self.requests[lease.request_id].finishing]:
            writes += self._end_lease(lid, "expired", requeue=True)
        for eid in [eid for eid, e in self.executors.items() if now - e.last_seen > 3 * self.lease_ttl_s]:
            writes += self.drop_executor(eid)
        return writes

    def _end_lease(self, lease_id: str, state: str, *, requeue: bool = False,
                   observed: Completion | None = None) -> list[Write]:
        lease = self.leases.pop(lease_id)
        self.counters[LEASE_END_COUNTERS[state]] += 1  # here, the one place a lease ends: counters equal the GMG
        replica = self.replicas.get(lease.replica_id)
        if replica is not None:
            replica.leases.discard(lease_id)
            replica.last_active = self.clock()
        executor = self.executors.get(lease.executor_id)
        if executor is not None:
            executor.leases.discard(lease_id)
        req = self.requests[lease.request_id]
        writes = [self.slice_row(lease, state, observed)]
        if requeue and req.status == RequestStatus.LEASED and req.lease_id == lease_id:
            req.status, req.lease_id = RequestStatus.QUEUED, None
            self._enqueue(req)
            writes.append(Write("request", req.update_row()))
        return writes

    def slice_row(self, lease: Lease, state: str, observed: Completion | None = None) -> Write:
        """A lease as a Slice: created whole when granted, then only its end is written, with the
        executor's observation when it completed (busy seconds, iterations, peak bytes)."""
        if state != "leased":
            row: dict[str, Any] = {"uid": lease.lease_id, "state": state, "end_wall": self.wall(),
                                   "busy_s": None, "iterations": None, "peak_bytes": None}
            if observed is not None:
                row.update(busy_s=observed.busy_s, iterations=observed.iterations, peak_bytes=observed.peak_bytes)
            return Write("slice_end", row)
        replica = self.replicas[lease.replica_id]
        req = self.requests[lease.request_id]
        return Write("slice_new", {"uid": lease.lease_id, "tenant_id": req.tenant_id, "model_uid": req.model_uid,
                                   "request_uid": req.request_id, "device_ids": list(replica.device_ids),
                                   "executor_id": lease.executor_id, "state": state,
                                   "start_wall": lease.granted_wall, "end_wall": None})

    # ---- views -------------------------------------------------------------------------------
    def queued(self) -> Iterator[LiveRequest]:
        return (r for r in self.requests.values() if r.status == RequestStatus.QUEUED)

    def in_flight(self) -> Iterable[LiveRequest]:
        return (r for r in self.requests.values() if r.status == RequestStatus.LEASED)
