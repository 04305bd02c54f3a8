"""Onboarding (no key needed to ask) and access requests, decided by the platform admin; what
each step does: :mod:`service.live.onboarding`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.deps import AdminPrincipal, ManagePrincipal, Svc
from service.api.responses import AccessRequestOut, ClaimOut, OnboardingSubmittedOut
from service.api.schemas import AccessChangeIn, ClaimIn, DecisionIn, OnboardingIn
from service.domain.error import InvalidInputError
from service.domain.principal import scoped_tenant

router = APIRouter(tags=["onboarding"])


@router.post("/v1/onboarding", status_code=202, response_model=OnboardingSubmittedOut)
async def submit_onboarding(body: OnboardingIn, svc: Svc) -> dict[str, Any]:
    """Ask for a tenant (no key needed). Answers the request and its claim token, shown once:
    after a platform admin approves, the token claims the tenant's first key."""
    payload = body.model_dump(exclude={"tenant_id"})
    payload["quota"] = body.quota.model_dump()
    req, token = await svc.governance.submit_onboarding(body.tenant_id, payload)
    return {**req.public(), "claim_token": token}


@router.post("/v1/onboarding/{request_id}/claim", response_model=ClaimOut)
async def claim(request_id: str, body: ClaimIn, svc: Svc) -> dict[str, Any]:
    """The request's status and history for its claim token; once approved, the tenant's first
    key (tenant_admin), the first time only."""
    return await svc.governance.claim(request_id, body.claim_token)


@router.post("/v1/access-requests", status_code=201, response_model=AccessRequestOut)
async def submit_change(body: AccessChangeIn, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """The tenant's admin asks for a change: more quota, a new model, another SLA class."""
    tenant_id = scoped_tenant(p, body.tenant_id)
    if body.kind == "quota":
        if body.quota is None:
            raise InvalidInputError("a quota request names the quota it asks for", culprit="quota")
        payload: dict[str, Any] = {"quota": body.quota.model_dump()}
    elif body.kind == "model":
        if body.model_id is None or body.family is None:
            raise InvalidInputError("a model request names model_id and family", culprit="model_id")
        payload = {"model_id": body.model_id, "family": body.family}
    else:
        if body.sla_class is None:
            raise InvalidInputError("an sla_class request names the class", culprit="sla_class")
        payload = {"sla_class": body.sla_class}
    if body.note:
        payload["note"] = body.note
    if body.project_id is not None and body.kind != "quota":
        raise InvalidInputError("project_id applies to quota requests", culprit="project_id")
    req = await svc.governance.submit_change(p, tenant_id, body.kind, payload, body.project_id)
    return req.public()


@router.get("/v1/access-requests", response_model=list[AccessRequestOut])
async def list_access_requests(svc: Svc, p: ManagePrincipal,
                               status: Annotated[str | None, Query(pattern="^(pending|approved|rejected)$")] = None
                               ) -> list[dict[str, Any]]:
    """Admin: every request (the approval queue with ``status=pending``); a tenant admin: its own."""
    return [r.public() for r in svc.access_requests.listed(None if p.is_admin else p.tenant_id, status)]


@router.get("/v1/access-requests/{request_id}", response_model=AccessRequestOut)
async def get_access_request(request_id: str, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    return svc.access_requests.get(request_id, None if p.is_admin else p.tenant_id).public()


@router.post("/v1/access-requests/{request_id}/approve", response_model=AccessRequestOut)
async def approve(request_id: str, body: DecisionIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: approve and apply (onboarding creates the tenant, its quota and models)."""
    return (await svc.governance.decide(p, request_id, True, body.reason)).public()


@router.post("/v1/access-requests/{request_id}/reject", response_model=AccessRequestOut)
async def reject(request_id: str, body: DecisionIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: reject, with the reason the requester will read."""
    return (await svc.governance.decide(p, request_id, False, body.reason)).public()
