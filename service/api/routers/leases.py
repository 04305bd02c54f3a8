"""Executor leases: long poll, renew, progress, complete, fail. Poll, progress and complete are the
hot paths: they answer plain ``JSONResponse`` (no response-model encoding) and document their schema."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import ExecutorPrincipal, Svc
from service.api.responses import CompleteOut, LeaseFailedOut, LeaseRenewedOut, PollOut, ProgressOut
from service.api.schemas import CompleteIn, FailIn, PollIn, ProgressIn
from service.domain.wire import Completion, ProgressUpdate

router = APIRouter(tags=["leases"])


@router.post("/v1/leases/poll", response_class=JSONResponse, responses={200: {"model": PollOut}})
async def poll(body: PollIn, svc: Svc, p: ExecutorPrincipal) -> JSONResponse:
    """Long poll: the next leases for the executor's devices, waiting up to ``wait_s`` for work."""
    svc.pools.check_owner(p, body.executor_id)
    ready = None if body.ready is None else frozenset(body.ready)
    leases = await svc.leasing.poll_leases(body.executor_id, body.max_leases, body.wait_s, ready)
    return JSONResponse({"leases": leases})  # plain JSON: the hot path skips response encoding


@router.post("/v1/leases/{lease_id}/renew", response_model=LeaseRenewedOut)
async def renew(lease_id: str, svc: Svc, p: ExecutorPrincipal) -> dict[str, Any]:
    return {"lease_id": lease_id, "expires_in_s": svc.renew_lease(p, lease_id)}


@router.post("/v1/leases/progress", response_class=JSONResponse, responses={200: {"model": ProgressOut}})
async def progress(body: ProgressIn, svc: Svc, p: ExecutorPrincipal) -> JSONResponse:
    """New tokens of streaming leases (``offset``: the position of the first); the answer lists
    the executor's leases to stop (their requests ended, e.g. a client went away)."""
    svc.pools.check_owner(p, body.executor_id)
    cancel = svc.leasing.progress(body.executor_id,
                                  [ProgressUpdate(u.lease_id, u.offset, tuple(u.tokens)) for u in body.updates])
    return JSONResponse({"cancel": cancel})


@router.post("/v1/leases/complete", response_class=JSONResponse, responses={200: {"model": CompleteOut}})
async def complete(body: CompleteIn, svc: Svc, p: ExecutorPrincipal) -> JSONResponse:
    """Completions of leases; each is accepted only if its lease is live (exactly once)."""
    svc.pools.check_owner(p, body.executor_id)
    accepted, rejected = await svc.complete(body.executor_id, [
        Completion(c.lease_id, list(c.output_tokens), c.queued_s, c.ttft_s, c.e2e_s, c.iterations, c.busy_s,
                   c.peak_bytes, tuple(c.prefill_stage_s), tuple(c.decode_stage_s), c.decode_batch, c.decode_context)
        for c in body.results])
    return JSONResponse({"accepted": accepted, "rejected": rejected})


@router.post("/v1/leases/{lease_id}/fail", response_model=LeaseFailedOut)
async def fail(lease_id: str, body: FailIn, svc: Svc, p: ExecutorPrincipal) -> dict[str, Any]:
    svc.pools.check_owner(p, body.executor_id)
    svc.check_lease(p, lease_id)
    await svc.leasing.fail_lease(lease_id, body.executor_id, body.reason)
    return {"lease_id": lease_id, "failed": True}
