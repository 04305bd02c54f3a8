"""Typed dependencies of the routes: the service, the caller's key and the roles a route needs.

A route's signature says who may call it, by the roles of :mod:`service.domain.role`:
``AdminPrincipal`` (the platform admin), ``ExecutorPrincipal`` (admin or executor keys),
``SubmitPrincipal`` / ``ReadPrincipal`` / ``ManagePrincipal`` (a tenant's keys that may submit work,
read, or manage the tenant; the admin too), ``AuditPrincipal`` (admin or auditor), ``AnyPrincipal``
(any known key); the ``*Scope`` aliases give the tenant a tenant key is bound to (``None`` for a
platform key). A missing, unknown or expired key is a 401, a key of another role a 403
(``ForbiddenError``), both mapped once in :mod:`service.api.app`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from service.domain.error import NotLeaderError, UnauthorizedError
from service.domain.principal import Principal, require
from service.domain.role import (
    AUDIT_READ,
    AUDIT_VERIFY,
    EXECUTE,
    MANAGE,
    PLATFORM,
    READ,
    SUBMIT,
)

if TYPE_CHECKING:
    from service.live.service import LiveService


PROBES = frozenset({"/healthz", "/readyz", "/metrics"})  # answered by a standby too


# The dependencies are coroutines: FastAPI runs a plain function's dependency in its thread pool,
# two thread hops per call, which under a fleet's load queued calls for the pool's threads.


async def service_of(request: Request) -> LiveService:
    """The live service; with leader election on, a process that does not lead answers every
    call but the probes 503 ``not_leader`` (its state is not loaded, or no longer its to change)."""
    return _service(request)


def _service(request: Request) -> LiveService:
    svc: LiveService = request.app.state.service
    lead = svc.leadership
    if lead is not None and not (lead.leads and svc.taking_traffic) and request.url.path not in PROBES:
        raise NotLeaderError(lead.refusal(), retry_after_s=lead.interval_s)
    return svc


Svc = Annotated["LiveService", Depends(service_of)]


async def authenticate(request: Request) -> Principal:
    """The caller's role from ``Authorization: Bearer <key>``: the admin key, an executor pool's,
    a tenant's own key (its first tenant admin), or a person's or service's key (its role)."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise UnauthorizedError("send your key as 'Authorization: Bearer <key>'")
    return _service(request).principal_of(key)


AnyPrincipal = Annotated[Principal, Depends(authenticate)]


def _needs(*roles: str) -> Callable[[Principal], Awaitable[Principal]]:
    async def dependency(p: AnyPrincipal) -> Principal:
        require(p, *roles)
        return p

    return dependency


def _scope(*roles: str) -> Callable[[Principal], Awaitable[str | None]]:
    async def dependency(p: AnyPrincipal) -> str | None:
        """A platform key sees every tenant (``None``); a tenant's key its own; others a 403."""
        require(p, *roles)
        return p.tenant_id if p.is_tenant else None

    return dependency


AdminPrincipal = Annotated[Principal, Depends(_needs(*PLATFORM))]
ExecutorPrincipal = Annotated[Principal, Depends(_needs(*EXECUTE))]
SubmitPrincipal = Annotated[Principal, Depends(_needs(*SUBMIT))]  # admin, tenant admin, member
ReadPrincipal = Annotated[Principal, Depends(_needs(*READ))]  # ... and viewer
ManagePrincipal = Annotated[Principal, Depends(_needs(*MANAGE))]  # admin, tenant admin
AuditPrincipal = Annotated[Principal, Depends(_needs(*AUDIT_VERIFY))]  # admin, auditor
TenantScope = Annotated[str | None, Depends(_scope(*READ))]  # read a tenant's records
SubmitScope = Annotated[str | None, Depends(_scope(*SUBMIT))]  # change a tenant's work (cancel)
AuditScope = Annotated[str | None, Depends(_scope(*AUDIT_READ))]  # the audit log
