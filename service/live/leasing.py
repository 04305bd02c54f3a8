"""The executor side of a request's life, behind ``/v1/leases``: the long poll that hands out
leases, the progress of streaming leases and a lease's failure. Completions are
:meth:`LiveService.complete`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from service.domain.slice_state import SliceState
from service.domain.wire import LeaseGrant, ProgressUpdate
from service.live.notify import Signal
from service.live.records import LiveRequest, Write
from service.live.state import LiveState
from service.live.streams import StreamBook


class Leasing:
    """The executor side (a part of :class:`~service.live.service.LiveService`, its parts passed
    in): the in-memory ``state``, the token ``streams``, the ``work`` signal, ``persist`` (GMG soft
    writes), ``finish`` (a request's end, written then applied) and ``lease_ttl_s``."""

    def __init__(self, state: LiveState, streams: StreamBook, work: Signal, persist: Callable[[Iterable[Write]], None],
                 finish: Callable[[LiveRequest, dict[str, Any], Callable[[], Iterable[Write]]], Awaitable[None]],
                 lease_ttl_s: float) -> None:
        self.state, self.streams, self.work, self.persist = state, streams, work, persist
        self.finish, self.lease_ttl_s = finish, lease_ttl_s

    async def poll_leases(self, executor_id: str, max_leases: int, wait_s: float,
                          ready: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """The next leases for the executor's devices (at most ``max_leases``), waiting up to ``wait_s``
        for work; an empty list when none came (``ready``: :meth:`LeaseBook.grant`). Granted leases
        are persisted (write-behind)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        state = self.state
        while True:
            woken = self.work.waiter(executor_id)
            try:
                grants = state.grant(executor_id, max_leases, ready)
                remaining = deadline - loop.time()
                if not grants and max_leases > 0 and remaining > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(woken), remaining)
                    continue
            finally:
                self.work.forget(woken)
            if not grants:
                return []
            self.persist(state.slice_row(lease, SliceState.RUNNING) for lease, _, _ in grants)
            leases = []
            for lease, replica, req in grants:
                model = state.models[req.model_uid]
                leases.append(LeaseGrant(
                    lease_id=lease.lease_id, request_id=req.request_id, replica_id=replica.replica_id,
                    family=model.family, seed=model.seed,
                    stages=state.stages(replica, executor_id, model.config.n_layers),
                    prompt_tokens=tuple(req.prompt), max_tokens=req.max_tokens, tenant_id=req.tenant_id,
                    model_id=req.model_id, expires_in_s=self.lease_ttl_s, model_path=model.path,
                    sampling=req.sampling, stop_ids=model.tokenizer.stop_ids,
                    stream=self.streams.wants_progress(req.request_id), guest=replica.guest,
                    tpot_s=req.sla.tbt_s, yields=replica.yields).to_json())
            return leases

    def progress(self, executor_id: str, updates: list[ProgressUpdate]) -> list[str]:
        """New tokens of the executor's streaming leases, to their streams; returns those of the
        leases that it should stop (no longer live, e.g. cancelled: as a heartbeat does), whose
        updates change nothing."""
        leases = self.state.leases
        for u in updates:
            lease = leases.get(u.lease_id)
            if lease is not None and lease.executor_id == executor_id:
                self.streams.offer(lease.request_id, u.offset, u.tokens)
        return self.state.book.stale(executor_id, (u.lease_id for u in updates))

    async def fail_lease(self, lease_id: str, executor_id: str | None, reason: str) -> None:
        """A lease failed: its request goes back to the queue (soft state), or, out of attempts, its
        failure is written before this returns."""
        state = self.state
        final = state.fail_row(lease_id, executor_id, reason)
        if final is None:
            self.persist(state.fail(lease_id, executor_id, reason))
            self.work.notify()
        else:
            req = state.requests[state.leases[lease_id].request_id]
            await self.finish(req, final, lambda: state.fail(lease_id, executor_id, reason))
