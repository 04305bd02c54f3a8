"""What-if predictions and the queue policy (admin), Cypher inspection (admin; named queries for tenants)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api import reports
from service.api.deps import AdminPrincipal, ReadPrincipal, Svc
from service.api.responses import CandidateWhatIfOut, InspectOut, PolicyWhatIfOut, QueuePolicyOut
from service.api.schemas import InspectIn, QueuePolicyIn, WhatIfIn
from service.live.audit import actor_of

router = APIRouter()


@router.post("/v1/whatif", tags=["scheduling"], response_model=CandidateWhatIfOut | PolicyWhatIfOut)
async def what_if(body: WhatIfIn, svc: Svc, _: AdminPrincipal) -> dict[str, Any]:
    """Admin: predict the next ``horizon_s`` with and without a replica of a model on
    ``device_ids``; or, with ``placement: slice``, what the slice policy would change now."""
    return await reports.what_if(svc, body.tenant_id, body.model_id, body.device_ids, body.placement, body.horizon_s)


@router.put("/v1/queue-policy", tags=["scheduling"], response_model=QueuePolicyOut)
async def set_queue_policy(body: QueuePolicyIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: order every model's queue by another policy from now on, without a restart (a
    policy testbench runs one after another on the same executors); 409 while any request is
    queued or leased, 400 for an unknown policy or parameter. ``slack`` on a service with a
    predictor (``--predictor``) orders by predicted latest start times."""
    policy = svc.queue_policy(body.queue, dict(body.params))
    previous = svc.set_queue_policy(policy)
    await svc.audit.append(actor_of(p), "queue_policy.set", "service", before={"queue": previous},
                           after={"queue": body.queue, "params": body.params})
    return {"queue": body.queue, "params": dict(body.params), "previous": previous}


@router.post("/v1/inspect", tags=["inspection"], response_model=InspectOut)
async def inspect(body: InspectIn, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    """Read-only Cypher (admin) or a named query; tenant keys run named queries scoped to themselves."""
    table = await reports.inspect(svc, p, body.query, body.name, body.params)
    return {"columns": table.columns, "rows": table.rows, "truncated": table.truncated}
