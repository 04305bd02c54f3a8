"""Executor pools (admin) and rotating and revoking tenant and pool keys, over HTTP: the changes
are :class:`service.live.key_admin.KeyAdmin`'s; what a pool is: :mod:`service.live.keys`."""

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
from service.domain.principal import own_tenant
from service.live.audit import actor_of
from service.live.keys import DEFAULT_MAX_DEVICES, DEFAULT_MAX_MEM_BYTES

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
    pool, key = await svc.key_admin.create_pool(actor_of(p), body.pool_id, body.allowed_kinds, body.max_devices,
                                                body.max_mem_bytes)
    return {**pool.public([]), "api_key": key}


@router.get("/v1/executor-pools", response_model=list[ExecutorPoolOut])
async def list_executor_pools(svc: Svc, _: AdminPrincipal) -> list[dict[str, Any]]:
    return svc.key_admin.list_pools()


@router.post("/v1/executor-pools/{pool_id}/keys/rotate", response_model=PoolKeyOut)
async def rotate_pool_key(pool_id: str, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: a new key for the pool (shown once); the old one is refused from now on. The
    pool's executors keep their ids: restart them with the new key."""
    return {"pool_id": pool_id, "api_key": await svc.key_admin.rotate_pool_key(actor_of(p), pool_id)}


@router.post("/v1/executor-pools/{pool_id}/keys/revoke", response_model=PoolKeyRevokedOut)
async def revoke_pool_key(pool_id: str, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: the pool's key is refused from now on and its executors are dropped (their
    leases go back to the queue)."""
    dropped = await svc.key_admin.revoke_pool_key(actor_of(p), pool_id)
    return {"pool_id": pool_id, "revoked": True, "executors_dropped": dropped}


@router.post("/v1/tenants/{tenant_id}/keys/rotate", response_model=TenantKeyOut)
async def rotate_tenant_key(tenant_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Admin, or the tenant's admin: a new key (shown once); the old one is refused from now on."""
    own_tenant(p, tenant_id)
    return {"tenant_id": tenant_id, "api_key": await svc.key_admin.rotate_tenant_key(actor_of(p), tenant_id)}


@router.post("/v1/tenants/{tenant_id}/keys/revoke", response_model=TenantKeyRevokedOut)
async def revoke_tenant_key(tenant_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Admin, or the tenant's admin: the key is refused from now on; the tenant's models and
    requests stay (queued requests still run). A rotation issues a new key."""
    own_tenant(p, tenant_id)
    await svc.key_admin.revoke_tenant_key(actor_of(p), tenant_id)
    return {"tenant_id": tenant_id, "revoked": True}
