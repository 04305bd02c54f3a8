"""Requests in over HTTP: the per-request SLO, priority and project headers, and a native
request body turned into a queued request (:mod:`service.live.intake` builds and cancels)."""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Header

from service.api.schemas import ID, RequestIn
from service.domain.error import InvalidInputError
from service.domain.tokenizer import BYTES
from service.live.intake import PRIORITY_RANGE, RequestHints, sampling_of
from service.live.records import LiveRequest

if TYPE_CHECKING:
    from service.live.service import LiveService

MAX_SLO_MS = 86_400_000.0  # a day


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


def new_request(svc: LiveService, tenant_id: str, body: RequestIn, idempotency_key: str | None,
                hints: RequestHints | None = None, project_id: str = "default") -> LiveRequest:
    """A native request (``POST /v1/requests``); with an idempotency key, the digest of the
    body that a retry must match."""
    if (body.prompt is None) == (body.prompt_tokens is None):
        raise InvalidInputError("give exactly one of prompt (text) and prompt_tokens (ids)")
    model = svc.reads.model_by_uid(f"{tenant_id}/{body.model_id}")  # an unknown model is refused just below
    tok = model.tokenizer if model is not None else BYTES
    prompt = tok.encode(body.prompt) if body.prompt is not None else list(body.prompt_tokens or [])
    req = svc.intake.build_request(tenant_id, body.model_id, prompt, body.max_tokens, sla_class=body.sla_class,
                                   sampling=sampling_of(body.temperature, body.top_p, body.seed), hints=hints,
                                   project_id=project_id)
    if idempotency_key is not None:
        req.idempotency_key = idempotency_key
        req.body_sha = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    return req
