"""The live service's in-memory state, under one name: :class:`LiveState`.

It composes the :class:`~service.live.registry.Registry` (tenants, models, executors, devices,
replicas) and the :class:`~service.live.lease_book.LeaseBook` (requests, queues, leases) and shows
their tables and operations under the names callers use; it adds only what spans both (a new
model's queue). Owned by the event loop of the API process (every mutation runs there, so no
locks). It is the mirror of the GMG the scheduler reads; Neo4j is the system of record.
"""

from __future__ import annotations

from collections.abc import Callable

from service.core.batching import LIVE_BATCHING
from service.core.queue import QueuePolicy
from service.live.lease_book import LeaseBook
from service.live.records import LiveModel
from service.live.registry import Registry


class LiveState:
    def __init__(self, policy: QueuePolicy, *, clock: Callable[[], float], wall: Callable[[], float],
                 lease_ttl_s: float = 10.0, max_attempts: int = 3, max_batch: int = 8,
                 kv_reserve_tokens: int = LIVE_BATCHING.kv_reserve_tokens) -> None:
        self.policy = policy
        self.wall = wall  # epoch seconds (key expiry, quota meters)
        self.registry = r = Registry(clock=clock, max_batch=max_batch, kv_reserve_tokens=kv_reserve_tokens)
        self.book = b = LeaseBook(r, policy, clock=clock, wall=wall, lease_ttl_s=lease_ttl_s,
                                  max_attempts=max_attempts)
        # the registry's tables and operations
        self.tenants, self.by_key_hash, self.models = r.tenants, r.by_key_hash, r.models
        self.devices, self.executors, self.replicas = r.devices, r.executors, r.replicas
        self.check_tenant, self.add_tenant, self.set_tenant_key = r.check_tenant, r.add_tenant, r.set_tenant_key
        self.tenant, self.check_new_model, self.model, self.executor = r.tenant, r.check_new_model, r.model, r.executor
        self.add_replica, self.remove_drained, self.apply = r.add_replica, r.remove_drained, r.apply
        self.kv_reserve_bytes, self.free_bytes = r.kv_reserve_bytes, r.free_bytes
        self.reachable, self.stages = r.reachable, r.stages
        # the lease book's
        self.requests, self.by_idempotency, self.leases, self.queues = b.requests, b.by_idempotency, b.leases, b.queues
        self.served, self.calibrator, self.iteration_s, self.counters = b.served, b.calibrator, b.iteration_s, b.counters
        self.new_request, self.accept, self.request, self.waiting = b.new_request, b.accept, b.request, b.waiting
        self.begin_finish, self.abandon_finish, self.adopt = b.begin_finish, b.abandon_finish, b.adopt
        self.cancel_row, self.cancel = b.cancel_row, b.cancel
        self.register_executor, self.heartbeat, self.drop_executor = b.register_executor, b.heartbeat, b.drop_executor
        self.grant, self.lease, self.renew, self.expire = b.grant, b.lease, b.renew, b.expire
        self.completion_row, self.complete, self.fail_row, self.fail = b.completion_row, b.complete, b.fail_row, b.fail
        self.slice_row, self.queued, self.in_flight = b.slice_row, b.queued, b.in_flight
        self.takers = b.takers

    def set_queue_policy(self, policy: QueuePolicy) -> None:
        """The queue policy of every model from now on (``ConflictError`` while requests wait or run)."""
        self.book.set_policy(policy)
        self.policy = policy

    def add_model(self, model: LiveModel) -> None:
        self.registry.add_model(model)
        self.book.open_queue(model.uid)
