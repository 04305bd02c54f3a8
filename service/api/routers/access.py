"""Keys of people and services, auditor keys, projects, quotas and usage; who may call what:
:mod:`service.domain.role` and the matrix in docs/API.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from service.api.deps import AdminPrincipal, AnyPrincipal, ManagePrincipal, ReadPrincipal, Svc
from service.api.responses import ApiKeyCreatedOut, ApiKeyOut, ProjectOut, TenantUsageOut, WhoAmIOut
from service.api.schemas import ApiKeyIn, AuditorKeyIn, ProjectIn, QuotaIn
from service.domain.error import NotFoundError
from service.domain.principal import own_tenant
from service.domain.quota import Quota
from service.domain.role import AUDITOR
from service.live.audit import actor_of

if TYPE_CHECKING:
    from service.live.service import LiveService

router = APIRouter(tags=["access"])


def _quota(q: QuotaIn | None) -> Quota:
    return Quota() if q is None else Quota(q.tokens_per_s, q.device_s_per_hour, q.mem_bytes)


@router.get("/v1/whoami", response_model=WhoAmIOut)
async def whoami(p: AnyPrincipal) -> dict[str, Any]:
    """The caller's role, tenant, key and projects (what the console shows and hides by)."""
    return {"role": p.role, "tenant_id": p.tenant_id, "key_id": p.key_id, "projects": list(p.projects)}


# ---- a tenant's keys ----------------------------------------------------------------------------------
@router.post("/v1/tenants/{tenant_id}/api-keys", status_code=201, response_model=ApiKeyCreatedOut)
async def create_api_key(tenant_id: str, body: ApiKeyIn, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Admin or the tenant's admin: a key for a person or service, with a role (tenant_admin,
    member, viewer), optionally limited to projects and with an expiry; shown once."""
    own_tenant(p, tenant_id)
    record, key = await svc.governance.create_key(p, tenant_id, body.key_id, body.name, body.role,
                                                  tuple(dict.fromkeys(body.projects)), body.expires_in_s)
    return {**record.public(svc.reads.wall()), "api_key": key}


@router.get("/v1/tenants/{tenant_id}/api-keys", response_model=list[ApiKeyOut])
async def list_api_keys(tenant_id: str, svc: Svc, p: ManagePrincipal) -> list[dict[str, Any]]:
    own_tenant(p, tenant_id)
    svc.reads.tenant(tenant_id)
    now = svc.reads.wall()
    return [k.public(now) for k in svc.access.keys_of(tenant_id)]


@router.post("/v1/tenants/{tenant_id}/api-keys/{key_id}/rotate", response_model=ApiKeyCreatedOut)
async def rotate_api_key(tenant_id: str, key_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """A new secret for the key (shown once); the old one is refused from now on."""
    own_tenant(p, tenant_id)
    record, key = await svc.governance.rotate_key(p, tenant_id, key_id)
    return {**record.public(svc.reads.wall()), "api_key": key}


@router.post("/v1/tenants/{tenant_id}/api-keys/{key_id}/revoke", response_model=ApiKeyOut)
async def revoke_api_key(tenant_id: str, key_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """The key is refused from now on (and after a restart)."""
    own_tenant(p, tenant_id)
    record = await svc.governance.revoke_key(p, tenant_id, key_id)
    return record.public(svc.reads.wall())


# ---- auditor keys -------------------------------------------------------------------------------------
@router.post("/v1/auditor-keys", status_code=201, response_model=ApiKeyCreatedOut)
async def create_auditor_key(body: AuditorKeyIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: a platform key that reads (and verifies) the whole audit log and nothing else."""
    record, key = await svc.governance.create_key(p, None, body.key_id, body.name, AUDITOR, (), body.expires_in_s)
    return {**record.public(svc.reads.wall()), "api_key": key}


@router.get("/v1/auditor-keys", response_model=list[ApiKeyOut])
async def list_auditor_keys(svc: Svc, _: AdminPrincipal) -> list[dict[str, Any]]:
    now = svc.reads.wall()
    return [k.public(now) for k in svc.access.keys_of(None)]


@router.post("/v1/auditor-keys/{key_id}/revoke", response_model=ApiKeyOut)
async def revoke_auditor_key(key_id: str, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    record = await svc.governance.revoke_key(p, None, key_id)
    return record.public(svc.reads.wall())


# ---- projects, quotas, usage --------------------------------------------------------------------------
def _project_public(svc: LiveService, tenant_id: str, project_id: str) -> dict[str, Any]:
    pr = svc.access.project(tenant_id, project_id)
    return {"tenant_id": tenant_id, "project_id": project_id, "description": pr.description,
            "quota": pr.quota.to_dict(), "created_at": pr.created_at}


@router.post("/v1/tenants/{tenant_id}/projects", status_code=201, response_model=ProjectOut)
async def create_project(tenant_id: str, body: ProjectIn, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Admin or the tenant's admin: a project, with its own quota (within the tenant's)."""
    own_tenant(p, tenant_id)
    await svc.governance.create_project(p, tenant_id, body.project_id, body.description, _quota(body.quota))
    return _project_public(svc, tenant_id, body.project_id)


@router.get("/v1/tenants/{tenant_id}/projects", response_model=list[ProjectOut])
async def list_projects(tenant_id: str, svc: Svc, p: ReadPrincipal) -> list[dict[str, Any]]:
    """The tenant's projects (a key limited to some: those)."""
    own_tenant(p, tenant_id)
    svc.reads.tenant(tenant_id)
    return [_project_public(svc, tenant_id, pr.project_id) for pr in svc.access.projects_of(tenant_id)
            if not p.projects or pr.project_id in p.projects]


@router.put("/v1/tenants/{tenant_id}/projects/{project_id}/quota", response_model=ProjectOut)
async def set_project_quota(tenant_id: str, project_id: str, body: QuotaIn, svc: Svc,
                            p: ManagePrincipal) -> dict[str, Any]:
    """Admin or the tenant's admin: a project's quota (the tenant's still binds)."""
    own_tenant(p, tenant_id)
    await svc.governance.set_project_quota(actor_of(p), tenant_id, project_id, _quota(body))
    return _project_public(svc, tenant_id, project_id)


@router.put("/v1/tenants/{tenant_id}/quota", response_model=TenantUsageOut)
async def set_tenant_quota(tenant_id: str, body: QuotaIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: the tenant's quota (a tenant asks for more through an access request)."""
    await svc.governance.set_tenant_quota(actor_of(p), tenant_id, _quota(body))
    return _usage(svc, tenant_id, p.projects)


@router.get("/v1/tenants/{tenant_id}/usage", response_model=TenantUsageOut)
async def usage(tenant_id: str, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    """Quota and usage of the tenant and of each of its projects (a key limited to some: those
    projects', and no tenant-wide meter, which counts the others' work)."""
    own_tenant(p, tenant_id)
    svc.reads.tenant(tenant_id)
    return _usage(svc, tenant_id, p.projects)


def _usage(svc: LiveService, tenant_id: str, limited_to: tuple[str, ...]) -> dict[str, Any]:
    projects = [pr.project_id for pr in svc.access.projects_of(tenant_id)
                if not limited_to or pr.project_id in limited_to]
    if not projects:
        raise NotFoundError(f"no tenant {tenant_id!r}")
    return {"tenant_id": tenant_id, "tenant": None if limited_to else svc.usage_public(tenant_id, None),
            "projects": {pid: svc.usage_public(tenant_id, pid) for pid in projects}}
