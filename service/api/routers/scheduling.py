"""What-if predictions (admin) and Cypher inspection (admin; named queries for tenants)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api import reports
from service.api.deps import AdminPrincipal, ReadPrincipal, Svc
from service.api.responses import CandidateWhatIfOut, InspectOut, PolicyWhatIfOut
from service.api.schemas import InspectIn, WhatIfIn

router = APIRouter()


@router.post("/v1/whatif", tags=["scheduling"], response_model=CandidateWhatIfOut | PolicyWhatIfOut)
async def what_if(body: WhatIfIn, svc: Svc, _: AdminPrincipal) -> dict[str, Any]:
    """Admin: predict the next ``horizon_s`` with and without a replica of a model on
    ``device_ids``; or, with ``placement: slice``, what the slice policy would change now."""
    return await reports.what_if(svc, body.tenant_id, body.model_id, body.device_ids, body.placement, body.horizon_s)


@router.post("/v1/inspect", tags=["inspection"], response_model=InspectOut)
async def inspect(body: InspectIn, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    """Read-only Cypher (admin) or a named query; tenant keys run named queries scoped to themselves."""
    table = await reports.inspect(svc, p, body.query, body.name, body.params)
    return {"columns": table.columns, "rows": table.rows}
