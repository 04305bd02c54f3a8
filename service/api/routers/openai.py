"""The OpenAI-compatible API: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``stream: true``) and ``GET /v1/models`` (the caller's models).

The key is the Bearer token: a tenant key names its models by ``model_id``, an admin key by
``tenant_id/model_id``. A request is an ordinary request of the service (the same queue, leases,
record in Neo4j: ``GET /v1/requests/{id}``, where ``id`` is the answer's id after ``cmpl-`` or
``chatcmpl-``), with sampling, the SLO headers (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) and
``x-priority``. A stream sends each token as the executor reports it; a client that leaves
before its answer (mid-stream, or waiting for a whole answer) cancels its request, and the
executor stops it at its next report (or heartbeat). A model no executor serves now (no
replica) is a 409: the caller would wait until one does. Shapes and conversions:
:mod:`service.api.openai`; buffers: :mod:`service.live.streams`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from service.api import openai as oa
from service.api.deps import ReadPrincipal, SubmitPrincipal, Svc
from service.api.intake import Hints
from service.domain.error import (
    ConflictError,
    DatabaseUnavailableError,
    InvalidInputError,
    NotFoundError,
    NotServedError,
)
from service.domain.principal import Principal, require
from service.domain.request import RequestStatus
from service.live import intake
from service.live.records import TERMINAL, LiveModel, LiveRequest
from service.live.streams import TokenStream

if TYPE_CHECKING:
    from service.live.service import LiveService

log = logging.getLogger("slicesched.api")

router = APIRouter(tags=["openai"], responses={
    status: {"model": oa.OpenAIErrorOut, "description": what} for status, what in (
        (400, "Invalid or unsupported input (the message and param name it), a bad x-slo-*/x-priority header"),
        (401, "No key, or a key nobody holds"), (403, "An executor key"),
        (404, "No such model among the key's"),
        (409, "No executor serves the model now (no replica; retry later), or the request was cancelled meanwhile"),
        (429, "The model's queue is full; retry later"),
        (503, "Neo4j is unavailable; retry shortly"),
        (500, "The request failed (out of attempts), or an unexpected error"))})

STREAM_DOC = {"text/event-stream": {"schema": {
    "type": "string", "description": "with stream: true: `data: <chunk JSON>` events (chunks as the answer, "
                                     "choices[].delta for chat), then `data: [DONE]`"}}}


def _resolve(svc: LiveService, p: Principal, name: str) -> LiveModel:
    if p.is_tenant:
        model = svc.reads.model_by_uid(f"{p.tenant_id}/{name}")
    else:
        require(p, "admin")
        model = svc.reads.model_by_uid(name)
    if model is None:
        hint = "" if p.is_tenant else " (an admin key names a model tenant_id/model_id)"
        raise NotFoundError(f"the model {name!r} does not exist{hint}")
    return model


def _card(m: LiveModel, p: Principal) -> dict[str, Any]:
    return {"id": m.model_id if p.is_tenant else m.uid, "object": "model", "created": int(m.created_at),
            "owned_by": m.tenant_id}


@router.get(oa.MODELS_PATH, response_model=oa.ModelListOut)
async def list_models(svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    """The key's models (an admin key: every tenant's, as tenant_id/model_id)."""
    if not p.is_tenant:
        require(p, "admin")
    models = svc.reads.models(p.tenant_id if p.is_tenant else None)
    return {"object": "list", "data": [_card(m, p) for m in models]}


@router.get(oa.MODELS_PATH + "/{model_id:path}", response_model=oa.ModelCardOut)
async def get_model(model_id: str, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    return _card(_resolve(svc, p, model_id), p)


@router.post(oa.COMPLETIONS_PATH, response_class=JSONResponse,
             responses={200: {"model": oa.CompletionOut, "content": STREAM_DOC}})
async def completions(body: oa.CompletionIn, svc: Svc, p: SubmitPrincipal, hints: Hints, request: Request) -> Response:
    """A completion of ``prompt`` (text, or token ids)."""
    body.check_supported()
    model = _resolve(svc, p, body.model)
    prompt = model.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    return await _run(svc, request, p, model, body, prompt, body.max_tokens or oa.DEFAULT_MAX_TOKENS, hints,
                      chat=False)


@router.post(oa.CHAT_PATH, response_class=JSONResponse,
             responses={200: {"model": oa.ChatCompletionOut, "content": STREAM_DOC}})
async def chat_completions(body: oa.ChatCompletionIn, svc: Svc, p: SubmitPrincipal, hints: Hints,
                           request: Request) -> Response:
    """The assistant's reply to ``messages``, rendered with the model's chat template."""
    body.check_supported()
    model = _resolve(svc, p, body.model)
    prompt = model.tokenizer.chat(body.conversation())
    max_tokens = body.max_completion_tokens or body.max_tokens or model.config.max_seq_len - len(prompt)
    if max_tokens < 1:
        raise InvalidInputError(f"the conversation ({len(prompt)} tokens) fills the model's context of "
                                f"{model.config.max_seq_len} tokens", culprit="messages")
    return await _run(svc, request, p, model, body, prompt, max_tokens, hints, chat=True)


async def _run(svc: LiveService, request: Request, p: Principal, model: LiveModel, body: oa.SamplingBody,
               prompt: list[int], max_tokens: int, hints: intake.RequestHints, *, chat: bool) -> Response:
    """Submit the request and answer it whole, or as a stream."""
    if not svc.reads.serving(model.uid):
        raise NotServedError(f"no executor serves model {body.model!r} now; retry later")
    req = svc.intake.build_request(model.tenant_id, model.model_id, prompt, max_tokens, hints=hints,
                                   sampling=intake.sampling_of(body.temperature, body.top_p, body.seed),
                                   project_id=svc.intake.project_of(p, model.tenant_id, hints.project_id))
    stream = svc.streams.open(req.request_id, progress=bool(body.stream))
    try:
        await svc.accept_requests([req])
    except BaseException:
        svc.streams.close(req.request_id)
        raise
    ids = bool(body.return_token_ids)
    headers = {"x-request-id": req.request_id}
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _events(svc, req, stream, body.model, model, chat=chat, ids=ids, usage=usage,
                         stops=body.stop_sequences())
        return StreamingResponse(events, media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})
    try:
        answered = await _answered_or_left(request, stream)
    finally:
        svc.streams.close(req.request_id)
    if not answered:
        svc.streams.spawn(_cancel_abandoned(svc, req))
        return Response(status_code=499)  # nobody reads it (nginx's "client closed request")
    if req.status != RequestStatus.DONE:
        status, kind, message = _failure(req)
        return JSONResponse(oa.error_body(status, kind, message), status_code=status, headers=headers)
    return JSONResponse(oa.answer(req, body.model, model.tokenizer, chat=chat, token_ids=ids,
                                  stops=body.stop_sequences()), headers=headers)


async def _answered_or_left(request: Request, stream: TokenStream) -> bool:
    """Wait for the request's end (True), or for its client to leave first (False)."""
    async def left() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waits = {asyncio.ensure_future(stream.wait_end()), asyncio.ensure_future(left())}
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return stream.ended


def _failure(req: LiveRequest) -> tuple[int, str, str]:
    if req.status == RequestStatus.CANCELLED:
        return 409, "cancelled", f"request {req.request_id} was cancelled"
    return 500, "failed", f"request {req.request_id} failed: {req.error or 'no reason given'}"


async def _events(svc: LiveService, req: LiveRequest, stream: TokenStream, name: str, model: LiveModel, *, chat: bool,
                  ids: bool, usage: bool, stops: tuple[str, ...] = ()) -> AsyncIterator[str]:
    """The stream: a chunk per report of new tokens, a last chunk with the finish reason, the
    usage (if asked), ``[DONE]``. When the client leaves before the end, or a stop sequence ends
    the stream, the request is cancelled."""
    tok = model.tokenizer
    decoder = oa.IncrementalDecoder(tok)
    matcher = oa.StopMatcher(stops)
    sent = 0
    ended = False
    stopped = False
    try:
        if chat:
            yield oa.sse(oa.chunk(req, name, chat=True, text="", role=True))
        while not (stream.ended and sent == len(stream.tokens)):  # the end may come while a chunk is sent
            await stream.wait(sent)
            fresh = stream.tokens[sent:]
            sent += len(fresh)
            if fresh and not stream.diverged:
                text, stopped = matcher.push(decoder.push(fresh))
                if text or ids:
                    yield oa.sse(oa.chunk(req, name, chat=chat, text=text, token_ids=fresh if ids else None))
                if stopped:
                    break
        if stopped:
            yield oa.sse(oa.chunk(req, name, chat=chat, text=None if chat else "", finish="stop",
                                  token_ids=[] if ids else None))
            if usage:
                yield oa.sse(oa.usage_chunk(req, name, chat=chat, completion_tokens=sent))
            yield oa.sse("[DONE]")
            return  # the request is cancelled below: nobody reads the rest
        ended = True
        if stream.diverged or req.status != RequestStatus.DONE:
            status, kind, message = _failure(req) if not stream.diverged else (
                500, "diverged", f"request {req.request_id} ran again after its executor was lost and its tokens "
                                 f"differ from those streamed; GET /v1/requests/{req.request_id} has its result")
            yield oa.sse(oa.error_body(status, kind, message))
        else:
            tail, stopped = matcher.push(decoder.flush())
            tail += "" if stopped else matcher.flush()
            finish = "stop" if stopped else oa.finish_reason(req.output_tokens, tok.stop_ids)
            yield oa.sse(oa.chunk(req, name, chat=chat, text=tail if tail or not chat else None, finish=finish,
                                  token_ids=[] if ids else None))
            if usage:
                yield oa.sse(oa.usage_chunk(req, name, chat=chat))
        yield oa.sse("[DONE]")
    finally:
        svc.streams.close(req.request_id)
        if not ended and req.status not in TERMINAL:
            svc.streams.spawn(_cancel_abandoned(svc, req))


async def _cancel_abandoned(svc: LiveService, req: LiveRequest) -> None:
    """The client left: cancel its request (its executor stops it at its next report or heartbeat)."""
    with contextlib.suppress(ConflictError):  # it ended meanwhile
        try:
            await svc.intake.cancel_request(req)
        except DatabaseUnavailableError as exc:
            log.warning("request %s: its client left, but the cancel could not be written: %s", req.request_id, exc)
            return
        log.info("request %s cancelled: its streaming client left", req.request_id)
