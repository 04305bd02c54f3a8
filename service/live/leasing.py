"""The executor side of a request's life, behind ``/v1/leases``: the long poll that hands out
leases, the progress of streaming leases and a lease's failure. Completions are
:meth:`LiveService.complete`."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from service.domain.slice_state import SliceState
from service.domain.wire import LeaseGrant, ProgressUpdate

if TYPE_CHECKING:
    from service.live.service import LiveService


async def poll_leases(svc: LiveService, executor_id: str, max_leases: int, wait_s: float,
                      ready: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """The next leases for the executor's devices (at most ``max_leases``), waiting up to ``wait_s``
    for work; an empty list when none came (``ready``: :meth:`LeaseBook.grant`). Granted leases
    are persisted (write-behind)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    state = svc.state
    while True:
        woken = svc.work.event()
        grants = state.grant(executor_id, max_leases, ready)
        if grants or max_leases == 0:
            svc.persist(state.slice_row(lease, SliceState.RUNNING) for lease, _, _ in grants)
            leases = []
            for lease, replica, req in grants:
                model = state.models[req.model_uid]
                leases.append(LeaseGrant(
                    lease_id=lease.lease_id, request_id=req.request_id, replica_id=replica.replica_id,
                    family=model.family, seed=model.seed,
                    stages=state.stages(replica, executor_id, model.config.n_layers),
                    prompt_tokens=tuple(req.prompt), max_tokens=req.max_tokens, tenant_id=req.tenant_id,
                    model_id=req.model_id, expires_in_s=svc.settings.lease_ttl_s, model_path=model.path,
                    sampling=req.sampling, stop_ids=model.tokenizer.stop_ids,
                    stream=svc.streams.wants_progress(req.request_id), guest=replica.guest,
                    tpot_s=req.sla.tbt_s, yields=replica.yields).to_json())
            return leases
        remaining = deadline - loop.time()
        if remaining <= 0:
            return []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), remaining)


def progress(svc: LiveService, executor_id: str, updates: list[ProgressUpdate]) -> list[str]:
    """New tokens of the executor's streaming leases, to their streams; returns those of the
    leases that it should stop (no longer live, e.g. cancelled: as a heartbeat does), whose
    updates change nothing."""
    leases = svc.state.leases
    for u in updates:
        lease = leases.get(u.lease_id)
        if lease is not None and lease.executor_id == executor_id:
            svc.streams.offer(lease.request_id, u.offset, u.tokens)
    return svc.state.book.stale(executor_id, (u.lease_id for u in updates))


async def fail_lease(svc: LiveService, lease_id: str, executor_id: str | None, reason: str) -> None:
    """A lease failed: its request goes back to the queue (soft state), or, out of attempts, its
    failure is written before this returns."""
    state = svc.state
    final = state.fail_row(lease_id, executor_id, reason)
    if final is None:
        svc.persist(state.fail(lease_id, executor_id, reason))
        svc.work.notify()
    else:
        req = state.requests[state.leases[lease_id].request_id]
        await svc.finish(req, final, lambda: state.fail(lease_id, executor_id, reason))
