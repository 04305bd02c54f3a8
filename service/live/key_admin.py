"""Changing keys beyond the admin's: creating executor pools, rotating and revoking pool and
tenant keys. Each change is in Neo4j before memory changes (a revoked key is refused at once and
after a restart), then in the audit log; the HTTP layer only translates
(:mod:`service.api.routers.keys`). What a pool is: :mod:`service.live.keys`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from service.domain.audit import Actor
from service.domain.error import ConflictError
from service.graph.repository import GraphRepository
from service.live.audit import AuditLog, key_state
from service.live.credential import hash_key, new_key
from service.live.keys import BOOTSTRAP_POOL, CATALOGUE_KINDS, ExecutorPool, ExecutorPools
from service.live.records import Write
from service.live.state import LiveState


class Gate(Protocol):
    """The one way to Neo4j: its repository (set once the service started) and the bounded call."""

    @property
    def repo(self) -> GraphRepository | None: ...

    async def db(self, fn: Any, *args: Any, bound_s: float | None = -1.0, **kwargs: Any) -> Any: ...


class KeyAdmin:
    """``gate``: Neo4j; ``pools``, ``state``: the in-memory key indexes; ``audit``: the log;
    ``persist``: GMG writes of dropped executors; ``replan``: placement after executors left."""

    def __init__(self, gate: Gate, pools: ExecutorPools, state: LiveState, audit: AuditLog,
                 persist: Callable[[Iterable[Write]], None], replan: Callable[[], Awaitable[None]]) -> None:
        self.gate, self.pools, self.state, self.audit = gate, pools, state, audit
        self.persist, self.replan = persist, replan

    def _repo(self) -> GraphRepository:
        repo = self.gate.repo
        assert repo is not None, "keys change only once the service has started"
        return repo

    async def create_pool(self, actor: Actor, pool_id: str, allowed_kinds: list[str] | None, max_devices: int,
                          max_mem_bytes: int) -> tuple[ExecutorPool, str]:
        """A pool with its own key (returned once: only its hash is kept)."""
        if pool_id in self.pools.pools or pool_id == BOOTSTRAP_POOL:
            raise ConflictError(f"executor pool {pool_id!r} exists")
        key = new_key(f"pool-{pool_id}")
        pool = ExecutorPool(pool_id, hash_key(key), tuple(dict.fromkeys(allowed_kinds or CATALOGUE_KINDS)),
                            max_devices, max_mem_bytes)
        await self.gate.db(self._repo().live.upsert_executor_pool, pool.pool_id, key_hash=pool.key_hash,
                           allowed_kinds=list(pool.allowed_kinds), max_devices=pool.max_devices,
                           max_mem_bytes=pool.max_mem_bytes)  # persisted first: a key never outlives a crash unrecorded
        self.pools.add(pool)
        await self.audit.append(actor, "executor_pool.create", "executor_pool", pool.pool_id, pools=[pool.pool_id],
                                after={**pool.public([]), **key_state(pool.key_hash)})
        return pool, key

    def list_pools(self) -> list[dict[str, Any]]:
        return [pool.public(self.pools.executors_of(pid, self.state)) for pid, pool in sorted(self.pools.pools.items())]

    async def rotate_pool_key(self, actor: Actor, pool_id: str) -> str:
        """A new key (returned once); the old one is refused from now on."""
        before = key_state(self.pools.changeable(pool_id).key_hash)
        key = new_key(f"pool-{pool_id}")
        await self.gate.db(self._repo().live.set_executor_pool_key, pool_id, hash_key(key))
        self.pools.set_key(pool_id, hash_key(key))
        await self.audit.append(actor, "executor_pool.key.rotate", "executor_pool", pool_id, pools=[pool_id],
                                before=before, after=key_state(hash_key(key)))
        return key

    async def revoke_pool_key(self, actor: Actor, pool_id: str) -> list[str]:
        """The pool's key is refused from now on; its executors are dropped (their leases go
        back to the queue). Answers the executors dropped."""
        before = key_state(self.pools.changeable(pool_id).key_hash)
        await self.gate.db(self._repo().live.set_executor_pool_key, pool_id, None)
        self.pools.set_key(pool_id, None)
        dropped = self.pools.executors_of(pool_id, self.state)
        for executor_id in dropped:
            self.persist(self.state.drop_executor(executor_id))
        await self.audit.append(actor, "executor_pool.key.revoke", "executor_pool", pool_id, pools=[pool_id],
                                before=before, after=key_state(None), details={"executors_dropped": dropped})
        if dropped:
            await self.replan()
        return dropped

    async def rotate_tenant_key(self, actor: Actor, tenant_id: str) -> str:
        """A new key for the tenant (returned once); the old one is refused from now on."""
        before = key_state(self.state.tenant(tenant_id).key_hash)
        key = new_key(tenant_id)
        await self.gate.db(self._repo().live.set_tenant_key, tenant_id, hash_key(key))
        self.state.set_tenant_key(tenant_id, hash_key(key))
        await self.audit.append(actor, "tenant.key.rotate", "tenant", tenant_id, tenant_id, before=before,
                                after=key_state(hash_key(key)))
        return key

    async def revoke_tenant_key(self, actor: Actor, tenant_id: str) -> None:
        """The tenant's key is refused from now on; its models and requests stay."""
        before = key_state(self.state.tenant(tenant_id).key_hash)
        await self.gate.db(self._repo().live.set_tenant_key, tenant_id, None)
        self.state.set_tenant_key(tenant_id, None)
        await self.audit.append(actor, "tenant.key.revoke", "tenant", tenant_id, tenant_id, before=before,
                                after=key_state(None))
