"""Typed dependencies of the routes: the service, the caller's key and the roles a route needs.

A route's signature says who may call it: ``p: AdminPrincipal`` (admin keys), ``ExecutorPrincipal``
(admin or executor keys), ``AnyPrincipal`` (any known key), ``TenantScope`` (admin or tenant keys:
the tenant a tenant key is bound to, ``None`` for an admin). A missing or unknown key is a 401, a
key of another role a 403 (``ForbiddenError``), both mapped once in :mod:`service.api.app`.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from service.api.credential import hash_key
from service.domain.error import ForbiddenError, InvalidInputError, NotFoundError, UnauthorizedError

if TYPE_CHECKING:
    from service.api.service import LiveService


@dataclass(frozen=True)
class Principal:
    role: str  # admin | executor | tenant
    tenant_id: str | None = None
    pool_id: str | None = None  # an executor key's pool

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def service_of(request: Request) -> LiveService:
    svc: LiveService = request.app.state.service
    return svc


Svc = Annotated["LiveService", Depends(service_of)]


def authenticate(request: Request) -> Principal:
    """The caller's role from ``Authorization: Bearer <key>``."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise UnauthorizedError("send your key as 'Authorization: Bearer <key>'")
    service = service_of(request)
    if hmac.compare_digest(key, service.settings.admin_key):
        return Principal("admin")
    pool = service.pools.pool_of_key(key)
    if pool is not None:
        return Principal("executor", pool_id=pool)
    tenant = service.state.by_key_hash.get(hash_key(key))
    if tenant is None:
        raise UnauthorizedError("unknown key")
    return Principal("tenant", tenant)


AnyPrincipal = Annotated[Principal, Depends(authenticate)]


def require(p: Principal, *roles: str) -> None:
    if p.role not in roles:
        raise ForbiddenError(f"this needs a key of role {' or '.join(roles)} (yours: {p.role})")


async def admin(p: AnyPrincipal) -> Principal:
    require(p, "admin")
    return p


async def executor(p: AnyPrincipal) -> Principal:
    require(p, "admin", "executor")
    return p


async def tenant_scope(p: AnyPrincipal) -> str | None:
    """Admin keys see every tenant (``None``); a tenant key its own; an executor key nothing (403)."""
    if p.is_admin:
        return None
    require(p, "tenant")
    assert p.tenant_id is not None
    return p.tenant_id


AdminPrincipal = Annotated[Principal, Depends(admin)]
ExecutorPrincipal = Annotated[Principal, Depends(executor)]
TenantScope = Annotated[str | None, Depends(tenant_scope)]


def scoped_tenant(p: Principal, given: str | None) -> str:
    """The tenant a call acts for: a tenant key's own, or the admin's explicit choice."""
    if p.role == "tenant":
        assert p.tenant_id is not None
        if given is not None and given != p.tenant_id:
            raise NotFoundError(f"no tenant {given!r}")
        return p.tenant_id
    require(p, "admin")
    if given is None:
        raise InvalidInputError("admin keys must name the tenant_id")
    return given


def own_tenant(p: Principal, tenant_id: str) -> None:
    """Admin keys act for any tenant; a tenant key for itself only (any other is a 404)."""
    if p.role == "tenant":
        if p.tenant_id != tenant_id:
            raise NotFoundError(f"no tenant {tenant_id!r}")
        return
    require(p, "admin")
