"""Requests in and out of the queue on a client's behalf: building a request from what was
submitted (tokens, sampling, the per-request SLO and priority headers, idempotency digest) and
cancelling one. Acceptance is :meth:`LiveService.accept_requests`."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from service.domain.error import QueueFullError
from service.domain.principal import Principal
from service.domain.sampling import MAX_SEED, Sampling
from service.live.access import AccessBook
from service.live.records import LiveRequest, Write
from service.live.state import LiveState

PRIORITY_RANGE = (-100, 100)  # a request's priority, as a tenant's


@dataclass(frozen=True)
class RequestHints:
    """A request's own scheduling targets, from its headers; None: its tenant's."""

    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    priority: int | None = None
    project_id: str | None = None  # x-project: the tenant's project it belongs to


def sampling_of(temperature: float | None, top_p: float | None, seed: int | None) -> Sampling | None:
    """Sampling as asked (None: greedy, nothing asked); a sampled request without a seed gets one."""
    if temperature is None and top_p is None and seed is None:
        return None
    t = 0.0 if temperature is None else temperature
    if seed is None and t > 0:
        seed = secrets.randbelow(MAX_SEED)
    return Sampling(t, 1.0 if top_p is None else top_p, seed or 0)


class Intake:
    """Requests built and cancelled on a client's behalf (a part of
    :class:`~service.live.service.LiveService`, its parts passed in): the in-memory ``state``, the
    ``access`` book (projects), ``finish`` (a request's end, written then applied) and
    ``max_queued`` (a model's queue at most)."""

    def __init__(self, state: LiveState, access: AccessBook,
                 finish: Callable[[LiveRequest, dict[str, Any], Callable[[], Iterable[Write]]], Awaitable[None]],
                 max_queued: int) -> None:
        self.state, self.access, self.finish, self.max_queued = state, access, finish, max_queued

    def project_of(self, p: Principal, tenant_id: str, asked: str | None) -> str:
        """The project a key's submission belongs to (asked, or the key's one, else ``default``): one
        of the tenant's, and one the key may act in (a 403 otherwise)."""
        project_id = AccessBook.project_for(p.projects if p.is_tenant else (), asked)
        self.access.project(tenant_id, project_id)
        return project_id

    def build_request(self, tenant_id: str, model_id: str, prompt: list[int], max_tokens: int, *,
                      sampling: Sampling | None = None, hints: RequestHints | None = None,
                      sla_class: str | None = None, project_id: str = "default") -> LiveRequest:
        """A queued request of ``tenant_id`` (not yet accepted). Sampled without a seed, it gets a
        random one, kept with it (a re-leased run draws the same tokens). A full queue refuses it."""
        req = self.state.new_request(tenant_id, model_id, prompt, max_tokens, sla_class)
        queue = self.state.queues.get(req.model_uid)
        if queue is not None and len(queue) >= self.max_queued:
            raise QueueFullError(f"the queue of model {model_id!r} holds {len(queue)} requests; retry later")
        if sampling is not None:
            req.temperature, req.top_p, req.seed = sampling.temperature, sampling.top_p, sampling.seed
        if hints is not None:
            req.slo_ttft_s, req.slo_tpot_s, req.priority = hints.slo_ttft_s, hints.slo_tpot_s, hints.priority
        req.project_id = project_id
        return req

    async def cancel_request(self, req: LiveRequest) -> None:
        """Cancel; written to Neo4j before this returns (a ConflictError if it already finished)."""
        state = self.state
        state.begin_finish(req)
        await self.finish(req, state.cancel_row(req), lambda: state.cancel(req))
