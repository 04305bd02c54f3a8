"""Requests: submit (one or a batch, idempotent with a key), read, list, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query

from service.api import intake as http_intake
from service.api import reports
from service.api.deps import ReadPrincipal, SubmitPrincipal, Svc
from service.api.intake import Hints
from service.api.responses import AcceptedBatchOut, AcceptedOut, RequestOut
from service.api.schemas import RequestBatchIn, RequestIn
from service.domain.error import InvalidInputError, NotFoundError
from service.domain.principal import Principal, scoped_tenant
from service.live.records import STATUSES, LiveRequest

router = APIRouter(tags=["requests"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$",
                                              description="a retry with the same key (same tenant) returns the "
                                                          "first answer and creates nothing")]


@router.post("/v1/requests", status_code=202, response_model=AcceptedOut)
async def submit(body: RequestIn, svc: Svc, p: SubmitPrincipal, hints: Hints,
                 idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    """Submit a request; it is in Neo4j when this answers. With an ``Idempotency-Key``, a retry
    returns the first request (409 if the body differs) and never creates a second. The
    ``x-slo-*`` and ``x-priority`` headers give it targets and a priority of its own."""
    tenant_id = scoped_tenant(p, body.tenant_id)
    project_id = svc.intake.project_of(p, tenant_id, body.project_id or hints.project_id)
    req = http_intake.new_request(svc, tenant_id, body, idempotency_key, hints, project_id)
    (answer,) = await svc.accept_requests([req])
    return reports.accepted_public(answer)


@router.post("/v1/requests/batch", status_code=202, response_model=AcceptedBatchOut)
async def submit_batch(body: RequestBatchIn, svc: Svc, p: SubmitPrincipal, hints: Hints,
                       idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    """Submit up to 1,000 requests at once: all are accepted, or none (the error names the first
    bad one). With an ``Idempotency-Key``, item ``i`` carries the key ``<key>#<i>``: a retry of
    the batch returns the first requests and creates none. The headers apply to every item."""
    reqs = []
    for i, item in enumerate(body.requests):
        try:
            tenant_id = scoped_tenant(p, item.tenant_id)
            project_id = svc.intake.project_of(p, tenant_id, item.project_id or hints.project_id)
            reqs.append(http_intake.new_request(svc, tenant_id, item,
                                           None if idempotency_key is None else f"{idempotency_key}#{i}", hints,
                                           project_id))
        except (InvalidInputError, NotFoundError) as exc:
            raise InvalidInputError(f"requests[{i}]: {exc}") from None
    answers = await svc.accept_requests(reqs)
    return {"accepted": [reports.accepted_public(r) for r in answers]}


@router.get("/v1/requests/{request_id}", response_model=RequestOut)
async def get_request(request_id: str, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    return reports.request_public(svc, _visible(svc, p, request_id))


def _visible(svc: Svc, p: Principal, request_id: str) -> LiveRequest:
    """A request the key may see: its tenant's (a platform key: any), in its projects if limited."""
    req = svc.reads.request(request_id, p.tenant_id if p.is_tenant else None)
    if p.projects and req.project_id not in p.projects:
        raise NotFoundError(f"no request {request_id!r}")
    return req


@router.get("/v1/requests", response_model=list[RequestOut])
async def list_requests(svc: Svc, p: ReadPrincipal,
                        status: Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)})] = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[dict[str, Any]]:
    if status is not None and status not in STATUSES:
        raise InvalidInputError(f"unknown status {status!r} (valid: {', '.join(STATUSES)})")
    tenant = p.tenant_id if p.is_tenant else None
    out = [reports.request_public(svc, r) for r in svc.reads.requests()
           if (tenant is None or r.tenant_id == tenant) and (status is None or r.status == status)
           and (not p.projects or r.project_id in p.projects)]
    return out[-limit:]


@router.post("/v1/requests/{request_id}/cancel", response_model=RequestOut)
async def cancel(request_id: str, svc: Svc, p: SubmitPrincipal) -> dict[str, Any]:
    """Cancel a request; the cancel is in Neo4j when this answers (409 if it already finished)."""
    req = _visible(svc, p, request_id)
    await svc.intake.cancel_request(req)
    return reports.request_public(svc, req)
