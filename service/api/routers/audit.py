"""The audit log: read it with filters (admin: everything; a tenant key: its own tenant's entries
only), and verify its hash chain (admin). What is recorded and the guarantee: :mod:`service.live.audit`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.deps import AuditPrincipal, AuditScope, Svc
from service.api.responses import AuditPageOut, AuditVerifyOut
from service.domain.audit import AuditEntry
from service.domain.error import InvalidInputError, NotFoundError

router = APIRouter(tags=["audit"])

MAX_PAGE = 1000


@router.get("/v1/audit", response_model=AuditPageOut)
async def list_audit(
    svc: Svc, scope: AuditScope,
    tenant_id: Annotated[str | None, Query(description="entries of this tenant (a tenant key: its own only)")] = None,
    action: Annotated[str | None, Query(description="an action, or a prefix of dotted parts: 'tenant' matches "
                                                    "tenant.create and tenant.key.rotate")] = None,
    actor: Annotated[str | None, Query(description="who acted: admin, a tenant id, an executor id, scheduler, "
                                                   "service")] = None,
    target: Annotated[str | None, Query(description="the object acted on: a tenant id, a model uid "
                                                    "(tenant/model), an executor or pool id")] = None,
    since_seq: Annotated[int | None, Query(ge=1, description="the first seq (inclusive); pages go on from "
                                                             "next_since_seq")] = None,
    until_seq: Annotated[int | None, Query(ge=1, description="the last seq (inclusive)")] = None,
    since: Annotated[float | None, Query(description="from this time on (epoch seconds, inclusive)")] = None,
    until: Annotated[float | None, Query(description="before this time (epoch seconds)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="entries per page")] = 100,
) -> dict[str, Any]:
    """Admin keys read every entry; a tenant key reads only its own tenant's (never another's, nor
    the platform's: executors, pools, placement decisions). Oldest first, a page at a time."""
    if scope is not None:
        if tenant_id is not None and tenant_id != scope:
            raise NotFoundError(f"no tenant {tenant_id!r}")
        tenant_id = scope
    rows = await svc.reads.audit_log(
        tenant_id=tenant_id, action=action, actor=actor, target_id=target, since_seq=since_seq,
        until_seq=until_seq, since_at=since, until_at=until, limit=limit + 1)
    entries = [AuditEntry(**row).public() for row in rows[:limit]]
    return {"entries": entries, "next_since_seq": entries[-1]["seq"] + 1 if len(rows) > limit else None}


@router.get("/v1/audit/verify", response_model=AuditVerifyOut)
async def verify_audit(
    svc: Svc, _: AuditPrincipal,
    anchor_seq: Annotated[int | None, Query(ge=1, description="a seq whose hash was recorded earlier")] = None,
    anchor_hash: Annotated[str | None, Query(pattern="^[0-9a-f]{64}$", description="that hash")] = None,
) -> dict[str, Any]:
    """Admin: walk the whole chain, recompute every hash and check every link and the stored head;
    the first bad entry and why, or ok. With an anchor (a seq and the hash a verification
    reported for it earlier) it also checks that the chain was not rewritten since."""
    if (anchor_seq is None) != (anchor_hash is None):
        raise InvalidInputError("give both anchor_seq and anchor_hash, or neither")
    anchor = (anchor_seq, anchor_hash) if anchor_seq is not None and anchor_hash is not None else None
    started = time.perf_counter()
    result = await svc.reads.verify_audit(anchor)
    return {**result.public(), "seconds": time.perf_counter() - started}
