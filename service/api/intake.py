"""Requests in and out of the queue on a client's behalf: building a request from what was
submitted (tokens, sampling, the per-request SLO and priority headers, idempotency digest) and
cancelling one. Acceptance is :meth:`LiveService.accept_requests`."""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Header

from service.api.access import AccessBook
from service.api.deps import Principal
from service.api.records import LiveRequest
from service.api.schemas import ID, RequestIn
from service.domain.error import InvalidInputError, QueueFullError
from service.domain.sampling import MAX_SEED, Sampling
from service.domain.tokenizer import BYTES

if TYPE_CHECKING:
    from service.api.service import LiveService

MAX_SLO_MS = 86_400_000.0  # a day
PRIORITY_RANGE = (-100, 100)  # as a tenant's


@dataclass(frozen=True)
class RequestHints:
    """A request's own scheduling targets, from its headers; None: its tenant's."""

    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    priority: int | None = None
    project_id: str | None = None  # x-project: the tenant's project it belongs to


def _slo_s(name: str, raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = math.nan
    if not (math.isfinite(ms) and 0 < ms <= MAX_SLO_MS):
        raise InvalidInputError(f"header {name}: milliseconds in (0, {MAX_SLO_MS:.0f}], got {raw!r}")
    return ms / 1e3


def request_hints(
        x_slo_ttft_ms: Annotated[str | None, Header(description="this request's time-to-first-token target, "
                                                                "milliseconds (> 0); default: its SLA class's")] = None,
        x_slo_tpot_ms: Annotated[str | None, Header(description="its time-per-output-token target, milliseconds "
                                                                "(> 0); default: its SLA class's")] = None,
        x_priority: Annotated[str | None, Header(description="its queue priority, an integer in [-100, 100] "
                                                             "(higher first); default: its tenant's")] = None,
        x_project: Annotated[str | None, Header(pattern=ID, description="the tenant's project it belongs to (its "
                                                                       "quota and usage); default: the key's one "
                                                                       "project, else 'default'")] = None,
) -> RequestHints:
    """The per-request SLO and priority headers (a bad value is a 400 naming the header)."""
    priority = None
    if x_priority is not None:
        low, high = PRIORITY_RANGE
        try:
            priority = int(x_priority)
        except ValueError:
            priority = None
        if priority is None or not low <= priority <= high:
            raise InvalidInputError(f"header x-priority: an integer in [{low}, {high}], got {x_priority!r}")
    return RequestHints(_slo_s("x-slo-ttft-ms", x_slo_ttft_ms), _slo_s("x-slo-tpot-ms", x_slo_tpot_ms), priority,
                        x_project)


Hints = Annotated[RequestHints, Depends(request_hints)]


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


def new_request(svc: LiveService, tenant_id: str, body: RequestIn, idempotency_key: str | None,
                hints: RequestHints | None = None, project_id: str = "default") -> LiveRequest:
    """A native request (``POST /v1/requests``); with an idempotency key, the digest of the
    body that a retry must match."""
    if (body.prompt is None) == (body.prompt_tokens is None):
        raise InvalidInputError("give exactly one of prompt (text) and prompt_tokens (ids)")
    model = svc.state.models.get(f"{tenant_id}/{body.model_id}")  # an unknown model is refused just below
    tok = model.tokenizer if model is not None else BYTES
    prompt = tok.encode(body.prompt) if body.prompt is not None else list(body.prompt_tokens or [])
    req = build_request(svc, tenant_id, body.model_id, prompt, body.max_tokens, sla_class=body.sla_class,
                        sampling=sampling_of(body.temperature, body.top_p, body.seed), hints=hints,
                        project_id=project_id)
    if idempotency_key is not None:
        req.idempotency_key = idempotency_key
        req.body_sha = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    return req


async def cancel_request(svc: LiveService, req: LiveRequest) -> None:
    """Cancel; written to Neo4j before this returns (a ConflictError if it already finished)."""
    state = svc.state
    state.begin_finish(req)
    await svc.finish(req, state.cancel_row(req), lambda: state.cancel(req))
