"""Requests in and out of the queue on a client's behalf: building a request from what was
submitted (tokens, idempotency digest) and cancelling one. Acceptance is :meth:`LiveService.accept_requests`."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from service.api.records import LiveRequest
from service.api.schemas import RequestIn
from service.domain.error import InvalidInputError
from service.domain.tokenizer import BYTES

if TYPE_CHECKING:
    from service.api.service import LiveService


def new_request(svc: LiveService, tenant_id: str, body: RequestIn, idempotency_key: str | None) -> LiveRequest:
    """A queued request of ``tenant_id`` (not yet accepted); with an idempotency key, the digest
    of the body that a retry must match."""
    if (body.prompt is None) == (body.prompt_tokens is None):
        raise InvalidInputError("give exactly one of prompt (text) and prompt_tokens (ids)")
    model = svc.state.models.get(f"{tenant_id}/{body.model_id}")  # an unknown model is refused just below
    tok = model.tokenizer if model is not None else BYTES
    prompt = tok.encode(body.prompt) if body.prompt is not None else list(body.prompt_tokens or [])
    req = svc.state.new_request(tenant_id, body.model_id, prompt, body.max_tokens, body.sla_class)
    if idempotency_key is not None:
        req.idempotency_key = idempotency_key
        req.body_sha = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    return req


async def cancel_request(svc: LiveService, req: LiveRequest) -> None:
    """Cancel; written to Neo4j before this returns (a ConflictError if it already finished)."""
    state = svc.state
    state.begin_finish(req)
    await svc.finish(req, state.cancel_row(req), lambda: state.cancel(req))
