"""Tenants: create (admin; the key is shown once), list (admin), read (admin or the tenant)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api import reports
from service.api.deps import AdminPrincipal, ReadPrincipal, Svc
from service.api.responses import TenantCreatedOut, TenantOut
from service.api.schemas import TenantIn
from service.domain.principal import scoped_tenant
from service.live.audit import actor_of

router = APIRouter(tags=["tenants"])


@router.post("/v1/tenants", status_code=201, response_model=TenantCreatedOut)
async def create_tenant(body: TenantIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    key = await svc.registration.create_tenant(actor_of(p), body.tenant_id, body.sla_class, body.weight,
                                               body.priority)
    return {**reports.tenant_public(svc, body.tenant_id), "api_key": key}


@router.get("/v1/tenants", response_model=list[TenantOut])
async def list_tenants(svc: Svc, _: AdminPrincipal) -> list[dict[str, Any]]:
    return [reports.tenant_public(svc, t) for t in svc.reads.tenant_ids()]


@router.get("/v1/tenants/{tenant_id}", response_model=TenantOut)
async def get_tenant(tenant_id: str, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    return reports.tenant_public(svc, scoped_tenant(p, tenant_id))
