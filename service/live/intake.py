"""Requests in and out of the queue on a client's behalf: building a request from what was
submitted (tokens, sampling, the per-request SLO and priority headers, idempotency digest) and
cancelling one. Acceptance is :meth:`LiveService.accept_requests`."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.domain.error import QueueFullError
from service.domain.principal import Principal
from service.domain.sampling import MAX_SEED, Sampling
from service.live.access import AccessBook
from service.live.records import LiveRequest

if TYPE_CHECKING:
    from service.live.service import LiveService

PRIORITY_RANGE = (-100, 100)  # a request's priority, as a tenant's


@dataclass(frozen=True)
class RequestHints:
    """A request's own scheduling targets, from its headers; None: its tenant's."""

    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    priority: int | None = None
    project_id: str | None = None  # x-project: the tenant's project it belongs to


def project_of(svc: LiveService, p: Principal, tenant_id: str, asked: str | None) -> str:
    """The project a key's submission belongs to (asked, or the key's one, else ``default``): one
    of the tenant's, and one the key may act in (a 403 otherwise)."""
    project_id = AccessBook.project_for(p.projects if p.is_tenant else (), asked)
    svc.access.project(tenant_id, project_id)
    return project_id


def build_request(svc: LiveService, tenant_id: str, model_id: str, prompt: list[int], max_tokens: int, *,
                  sampling: Sampling | None = None, hints: RequestHints | None = None,
                  sla_class: str | None = None, project_id: str = "default") -> LiveRequest:
    """A queued request of ``tenant_id`` (not yet accepted). Sampled without a seed, it gets a
    random one, kept with it (a re-leased run draws the same tokens). A full queue refuses it."""
    req = svc.state.new_request(tenant_id, model_id, prompt, max_tokens, sla_class)
    queue = svc.state.queues.get(req.model_uid)
    if queue is not None and len(queue) >= svc.settings.max_queued:
        raise QueueFullError(f"the queue of model {model_id!r} holds {len(queue)} requests; retry later")
    if sampling is not None:
        req.temperature, req.top_p, req.seed = sampling.temperature, sampling.top_p, sampling.seed
    if hints is not None:
        req.slo_ttft_s, req.slo_tpot_s, req.priority = hints.slo_ttft_s, hints.slo_tpot_s, hints.priority
    req.project_id = project_id
    return req


def sampling_of(temperature: float | None, top_p: float | None, seed: int | None) -> Sampling | None:
    """Sampling as asked (None: greedy, nothing asked); a sampled request without a seed gets one."""
    if temperature is None and top_p is None and seed is None:
        return None
    t = 0.0 if temperature is None else temperature
    if seed is None and t > 0:
        seed = secrets.randbelow(MAX_SEED)
    return Sampling(t, 1.0 if top_p is None else top_p, seed or 0)


async def cancel_request(svc: LiveService, req: LiveRequest) -> None:
    """Cancel; written to Neo4j before this returns (a ConflictError if it already finished)."""
    state = svc.state
    state.begin_finish(req)
    await svc.finish(req, state.cancel_row(req), lambda: state.cancel(req))
