"""Executor pools (admin) and rotating and revoking tenant and pool keys; what a pool is and
how its key binds executors: :mod:`service.live.keys`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field

from service.api.deps import AdminPrincipal, ManagePrincipal, Svc
from service.api.responses import (
    ExecutorPoolCreatedOut,
    ExecutorPoolOut,
    PoolKeyOut,
    PoolKeyRevokedOut,
    TenantKeyOut,
    TenantKeyRevokedOut,
)
from service.api.schemas import ID, Body, Int
from service.domain.error import ConflictError
from service.domain.principal import own_tenant
from service.live.audit import actor_of, key_state
from service.live.credential import hash_key, new_key
from service.live.keys import BOOTSTRAP_POOL, CATALOGUE_KINDS, DEFAULT_MAX_DEVICES, DEFAULT_MAX_MEM_BYTES, ExecutorPool

KIND = r"^[A-Za-z0-9][A-Za-z0-9 _.:()-]{0,63}$"

router = APIRouter(tags=["keys"])


class ExecutorPoolIn(Body):
    pool_id: str = Field(pattern=ID)
    allowed_kinds: list[Annotated[str, Field(pattern=KIND)]] | None = Field(
        None, min_length=1, max_length=32,
        description="device kinds its executors may register (default: the catalogue's: cpu, A100-80GB, ...)")
    max_devices: Int = Field(DEFAULT_MAX_DEVICES, ge=1, le=4096,
                             description="devices its executors may register together")
    max_mem_bytes: Int = Field(DEFAULT_MAX_MEM_BYTES, ge=1, le=2**50,
                               description="memory one device may declare")


@router.post("/v1/executor-pools", status_code=201, response_model=ExecutorPoolCreatedOut)
async def create_executor_pool(body: ExecutorPoolIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: a pool of executors with its own key (shown once) and device limits."""
    pools = svc.pools
    if body.pool_id in pools.pools or body.pool_id == BOOTSTRAP_POOL:
        raise ConflictError(f"executor pool {body.pool_id!r} exists")
    key = new_key(f"pool-{body.pool_id}")
    pool = ExecutorPool(body.pool_id, hash_key(key), tuple(dict.fromkeys(body.allowed_kinds or CATALOGUE_KINDS)),
                        body.max_devices, body.max_mem_bytes)
    assert svc.repo is not None
    await svc.db(svc.repo.upsert_executor_pool, pool.pool_id, key_hash=pool.key_hash,
                 allowed_kinds=list(pool.allowed_kinds), max_devices=pool.max_devices,
                 max_mem_bytes=pool.max_mem_bytes)  # persisted first: a key never outlives a crash unrecorded
    pools.add(pool)
    await svc.audit.append(actor_of(p), "executor_pool.create", "executor_pool", pool.pool_id, pools=[pool.pool_id],
                           after={**pool.public([]), **key_state(pool.key_hash)})
    return {**pool.public([]), "api_key": key}


@router.get("/v1/executor-pools", response_model=list[ExecutorPoolOut])
async def list_executor_pools(svc: Svc, _: AdminPrincipal) -> list[dict[str, Any]]:
    pools = svc.pools
    return [pool.public(pools.executors_of(pid, svc.state)) for pid, pool in sorted(pools.pools.items())]


@router.post("/v1/executor-pools/{pool_id}/keys/rotate", response_model=PoolKeyOut)
async def rotate_pool_key(pool_id: str, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: a new key for the pool (shown once); the old one is refused from now on. The
    pool's executors keep their ids: restart them with the new key."""
    before = key_state(svc.pools.changeable(pool_id).key_hash)
    key = new_key(f"pool-{pool_id}")
    assert svc.repo is not None
    await svc.db(svc.repo.set_executor_pool_key, pool_id, hash_key(key))
    svc.pools.set_key(pool_id, hash_key(key))
    await svc.audit.append(actor_of(p), "executor_pool.key.rotate", "executor_pool", pool_id, pools=[pool_id],
                           before=before, after=key_state(hash_key(key)))
    return {"pool_id": pool_id, "api_key": key}


@router.post("/v1/executor-pools/{pool_id}/keys/revoke", response_model=PoolKeyRevokedOut)
async def revoke_pool_key(pool_id: str, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: the pool's key is refused from now on and its executors are dropped (their
    leases go back to the queue)."""
    pools = svc.pools
    before = key_state(pools.changeable(pool_id).key_hash)
    assert svc.repo is not None
    await svc.db(svc.repo.set_executor_pool_key, pool_id, None)
    pools.set_key(pool_id, None)
    dropped = pools.executors_of(pool_id, svc.state)
    for executor_id in dropped:
        svc.persist(svc.state.drop_executor(executor_id))
    await svc.audit.append(actor_of(p), "executor_pool.key.revoke", "executor_pool", pool_id, pools=[pool_id],
                           before=before, after=key_state(None), details={"executors_dropped": dropped})
    if dropped:
        await svc.replan()
    return {"pool_id": pool_id, "revoked": True, "executors_dropped": dropped}


@router.post("/v1/tenants/{tenant_id}/keys/rotate", response_model=TenantKeyOut)
async def rotate_tenant_key(tenant_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Admin, or the tenant's admin: a new key (shown once); the old one is refused from now on."""
    own_tenant(p, tenant_id)
    before = key_state(svc.state.tenant(tenant_id).key_hash)
    key = new_key(tenant_id)
    assert svc.repo is not None
    await svc.db(svc.repo.set_tenant_key, tenant_id, hash_key(key))
    svc.state.set_tenant_key(tenant_id, hash_key(key))
    await svc.audit.append(actor_of(p), "tenant.key.rotate", "tenant", tenant_id, tenant_id, before=before,
                           after=key_state(hash_key(key)))
    return {"tenant_id": tenant_id, "api_key": key}


@router.post("/v1/tenants/{tenant_id}/keys/revoke", response_model=TenantKeyRevokedOut)
async def revoke_tenant_key(tenant_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Admin, or the tenant's admin: the key is refused from now on; the tenant's models and
    requests stay (queued requests still run). A rotation issues a new key."""
    own_tenant(p, tenant_id)
    before = key_state(svc.state.tenant(tenant_id).key_hash)
    assert svc.repo is not None
    await svc.db(svc.repo.set_tenant_key, tenant_id, None)
    svc.state.set_tenant_key(tenant_id, None)
    await svc.audit.append(actor_of(p), "tenant.key.revoke", "tenant", tenant_id, tenant_id, before=before,
                           after=key_state(None))
    return {"tenant_id": tenant_id, "revoked": True}
