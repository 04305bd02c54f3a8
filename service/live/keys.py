"""Keys beyond the admin's: executor pools, and rotating and revoking tenant and pool keys.

An **executor pool** is what an executor key stands for: the admin creates one
(``POST /v1/executor-pools``, routes in :mod:`service.api.routers.keys`) with the device kinds
its executors may register and limits (devices in total, memory per device), and gets its key once; Neo4j keeps only the key's
SHA-256 (an ``ExecutorPool`` node, as tenant keys live on ``Tenant``). ``SLICESCHED_EXECUTOR_KEY``,
when set, is the key of the in-memory **bootstrap** pool (catalogue kinds, default limits); it
never defaults to the admin key. An executor id belongs to the pool that registered it: another
pool's key gets a 404 for it (a 403 when registering an id another pool holds). Admin keys keep
every executor right and are bound by no pool.

Rotation gives a new key and refuses the old one at once; revocation refuses the key at once
and leaves none (a later rotation issues a new one). Both are written to Neo4j before the
in-memory key index changes, so a restart keeps them; revoking a pool also drops its executors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from service.domain.cluster import DEVICE_KINDS
from service.domain.error import ConflictError, ForbiddenError, InvalidInputError, NotFoundError
from service.domain.principal import Principal
from service.live.credential import hash_key
from service.live.state import LiveState

BOOTSTRAP_POOL = "bootstrap"  # the pool of SLICESCHED_EXECUTOR_KEY (in memory only)
CATALOGUE_KINDS = tuple(DEVICE_KINDS)
DEFAULT_MAX_DEVICES = 64
DEFAULT_MAX_MEM_BYTES = 2**40  # 1 TiB per device


@dataclass
class ExecutorPool:
    pool_id: str
    key_hash: str | None  # SHA-256 hex of the pool's key; None: revoked
    allowed_kinds: tuple[str, ...]
    max_devices: int  # devices registered by the pool's executors together
    max_mem_bytes: int  # per device

    def public(self, executors: list[str]) -> dict[str, Any]:
        return {"pool_id": self.pool_id, "allowed_kinds": list(self.allowed_kinds), "max_devices": self.max_devices,
                "max_mem_bytes": self.max_mem_bytes, "key": "active" if self.key_hash else "revoked",
                "executors": executors}


class ExecutorPools:
    """The pools, the index from key hash to pool, and which pool registered each executor."""

    def __init__(self, bootstrap_key: str | None = None, bootstrap_kinds: Iterable[str] = ()) -> None:
        self.pools: dict[str, ExecutorPool] = {}
        self.by_key_hash: dict[str, str] = {}
        self.owner: dict[str, str | None] = {}  # executor id -> pool id (None: registered by an admin key)
        if bootstrap_key is not None:
            self.add(ExecutorPool(BOOTSTRAP_POOL, hash_key(bootstrap_key), tuple(bootstrap_kinds) or CATALOGUE_KINDS,
                                  DEFAULT_MAX_DEVICES, DEFAULT_MAX_MEM_BYTES))

    def add(self, pool: ExecutorPool) -> None:
        self.pools[pool.pool_id] = pool
        if pool.key_hash is not None:
            self.by_key_hash[pool.key_hash] = pool.pool_id

    def recover(self, rows: Iterable[dict[str, Any]]) -> None:
        for r in rows:
            if r["pool_id"] != BOOTSTRAP_POOL:
                self.add(ExecutorPool(r["pool_id"], r["key_hash"], tuple(r["allowed_kinds"] or CATALOGUE_KINDS),
                                      int(r["max_devices"] or DEFAULT_MAX_DEVICES),
                                      int(r["max_mem_bytes"] or DEFAULT_MAX_MEM_BYTES)))

    def pool(self, pool_id: str) -> ExecutorPool:
        found = self.pools.get(pool_id)
        if found is None:
            raise NotFoundError(f"no executor pool {pool_id!r}")
        return found

    def changeable(self, pool_id: str) -> ExecutorPool:
        """The pool whose key may be rotated or revoked: any but the bootstrap pool (a 409)."""
        pool = self.pool(pool_id)
        if pool_id == BOOTSTRAP_POOL:
            raise ConflictError("the bootstrap pool's key is SLICESCHED_EXECUTOR_KEY: change or unset it there and "
                                "restart the service")
        return pool

    def pool_of_key(self, key: str) -> str | None:
        return self.by_key_hash.get(hash_key(key))

    def set_key(self, pool_id: str, key_hash: str | None) -> None:
        pool = self.pool(pool_id)
        if pool.key_hash is not None:
            self.by_key_hash.pop(pool.key_hash, None)
        pool.key_hash = key_hash
        if key_hash is not None:
            self.by_key_hash[key_hash] = pool_id

    def executors_of(self, pool_id: str, state: LiveState) -> list[str]:
        return sorted(e for e, owner in self.owner.items() if owner == pool_id and e in state.executors)

    def check_registration(self, p: Principal, state: LiveState, executor_id: str,
                           devices: list[tuple[str, str, int]]) -> None:
        """Refuse, before anything is registered, an executor key's registration of devices its
        pool does not allow: a kind outside the pool's, more memory than the pool's limit per
        device or than a catalogued kind has, more devices than the pool's total; or an executor
        id that another pool (or an admin) registered and is live."""
        if p.role != "executor":
            return
        assert p.pool_id is not None
        pool = self.pool(p.pool_id)
        if executor_id in state.executors and self.owner.get(executor_id) != pool.pool_id:
            raise ForbiddenError(f"executor {executor_id!r} is registered by another key")
        for local, kind, mem_bytes in devices:
            if kind not in pool.allowed_kinds:
                raise ForbiddenError(f"device {local}: kind {kind!r} is not allowed for executor pool "
                                     f"{pool.pool_id!r} (allowed: {', '.join(pool.allowed_kinds)})")
            if mem_bytes > pool.max_mem_bytes:
                raise ForbiddenError(f"device {local}: {mem_bytes} bytes exceed the pool's limit of "
                                     f"{pool.max_mem_bytes} bytes per device")
            catalogued = DEVICE_KINDS.get(kind)
            if catalogued is not None and kind != "cpu" and mem_bytes > catalogued.mem_bytes:
                raise InvalidInputError(f"device {local}: a {kind} has {catalogued.mem_bytes} bytes, not {mem_bytes}")
        held = sum(len(state.executors[e].device_ids) for e in self.executors_of(pool.pool_id, state)
                   if e != executor_id)
        if held + len(devices) > pool.max_devices:
            raise ForbiddenError(f"executor pool {pool.pool_id!r} may register {pool.max_devices} devices in all "
                                 f"({held} registered, {len(devices)} more asked)")

    def bind(self, p: Principal, executor_id: str) -> None:
        self.owner[executor_id] = p.pool_id if p.role == "executor" else None

    def check_owner(self, p: Principal, executor_id: str | None) -> None:
        """An executor key acts only for executors its pool registered: others are a 404."""
        if p.role == "executor" and executor_id is not None and self.owner.get(executor_id, "") != p.pool_id:
            raise NotFoundError(f"no executor {executor_id!r}: register first")

    def check_lease(self, p: Principal, state: LiveState, lease_id: str) -> None:
        lease = state.leases.get(lease_id)
        if p.role == "executor" and lease is not None and self.owner.get(lease.executor_id, "") != p.pool_id:
            raise NotFoundError(f"no live lease {lease_id!r}")
