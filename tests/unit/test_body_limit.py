"""The body limit at the ASGI level: what it reads of a body before refusing it (nothing, for a
declared length over the limit or a large body without a known key; at most the limit plus one
chunk, for a chunked one), so an oversized body is never buffered."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import Message

from service.api.body_limit import PREAUTH_BYTES, BodyLimit
from service.domain.error import SliceschedError, UnauthorizedError

LIMIT = 2 * PREAUTH_BYTES
BULK = 8 * PREAUTH_BYTES


async def _authenticate(request: Request) -> str:
    if request.headers.get("authorization") != "Bearer good":
        raise UnauthorizedError("unknown key")
    return "caller"


def _refuse(request: Request, exc: SliceschedError) -> JSONResponse:
    return JSONResponse({"error": {"kind": exc.kind, "message": str(exc)}}, status_code=exc.http_status or 500)


def _app() -> tuple[FastAPI, list[int]]:
    api = FastAPI()
    seen: list[int] = []  # the sizes of the bodies the routes got

    @api.post("/v1/thing")
    async def thing(request: Request, who: Annotated[str, Depends(_authenticate)]) -> dict[str, Any]:
        seen.append(len(await request.body()))
        return {"ok": True}

    @api.post("/v1/requests/batch")
    async def batch(request: Request, who: Annotated[str, Depends(_authenticate)]) -> dict[str, Any]:
        seen.append(len(await request.body()))
        return {"ok": True}

    @api.post("/v1/onboarding")
    async def open_door(request: Request) -> dict[str, Any]:
        seen.append(len(await request.body()))
        return {"ok": True}

    async def handler(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SliceschedError)
        return _refuse(request, exc)

    api.add_exception_handler(SliceschedError, handler)
    routes = [r for r in api.router.routes if isinstance(r, APIRoute)]
    api.add_middleware(BodyLimit, routes=routes, limit_bytes=LIMIT, bulk_limit_bytes=BULK, authenticate=_authenticate,
                       refuse=_refuse)
    return api, seen


def _call(api: FastAPI, path: str, chunks: list[bytes], *, key: str | None, declared: int | None) -> tuple[
        int, dict[str, Any], int]:
    """POST ``chunks`` as a body (``declared``: its Content-Length; None: chunked); the answer's
    status, its JSON and how many chunks the app side pulled from the client."""
    headers = [(b"content-type", b"application/octet-stream")]
    headers.append((b"content-length", str(declared).encode()) if declared is not None
                   else (b"transfer-encoding", b"chunked"))
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "server": ("test", 80), "client": ("client", 1)}
    pulled = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pulled
        if pulled >= len(chunks):
            return {"type": "http.disconnect"}
        pulled += 1
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}

    async def send(message: Message) -> None:
        sent.append(message)

    async def run() -> None:
        scope["app"] = api
        await api(scope, receive, send)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), pulled


def test_a_declared_length_over_the_limit_is_refused_unread_with_or_without_a_key() -> None:
    api, seen = _app()
    huge = 200 * 1024 * 1024
    for key in (None, "good", "bad"):
        status, body, pulled = _call(api, "/v1/thing", [b"x" * 1024] * 4, key=key, declared=huge)
        assert (status, body["error"]["kind"], pulled) == (413, "too_large", 0)
        assert "request body too large: 209,715,200 bytes" in body["error"]["message"]
        assert "at most 131,072 bytes (SLICESCHED_MAX_BODY_BYTES)" in body["error"]["message"]
    assert seen == []


def test_a_large_body_is_read_only_for_a_known_key() -> None:
    api, seen = _app()
    size = PREAUTH_BYTES + 1
    chunks = [b"x" * size]
    assert _call(api, "/v1/thing", chunks, key=None, declared=size)[::2] == (401, 0)
    assert _call(api, "/v1/thing", chunks, key="bad", declared=size)[::2] == (401, 0)
    assert _call(api, "/v1/thing", chunks, key="good", declared=size)[::2] == (200, 1)
    # a route that takes no key reads it (within its limit); a small body is never looked at
    assert _call(api, "/v1/onboarding", chunks, key=None, declared=size)[::2] == (200, 1)
    assert _call(api, "/v1/thing", [b"{}"], key=None, declared=2)[0] == 401  # the route's own 401
    assert seen == [size, size]


def test_bulk_routes_take_the_larger_limit() -> None:
    api, seen = _app()
    size = LIMIT + 1
    assert _call(api, "/v1/thing", [b"x" * size], key="good", declared=size)[0] == 413
    assert _call(api, "/v1/requests/batch", [b"x" * size], key="good", declared=size)[0] == 200
    status, body, _ = _call(api, "/v1/requests/batch", [b"x"], key="good", declared=BULK + 1)
    assert status == 413 and "SLICESCHED_MAX_BULK_BODY_BYTES" in body["error"]["message"]
    assert seen == [size]


def test_a_chunked_body_is_counted_and_cut_at_its_limit() -> None:
    api, seen = _app()
    chunk = b"x" * (16 * 1024)
    many = [chunk] * 1000  # 16 MB on offer
    status, body, pulled = _call(api, "/v1/thing", many, key="good", declared=None)
    assert status == 413 and body["error"]["kind"] == "too_large" and "more than 131,072 bytes" in body["error"]["message"]
    assert pulled == LIMIT // len(chunk) + 1  # the limit, plus the chunk that passed it
    assert seen == []
    # without a key, a chunked body is not read at all; within the limit it passes whole
    assert _call(api, "/v1/thing", many, key=None, declared=None)[::2] == (401, 0)
    assert _call(api, "/v1/thing", [chunk] * 3, key="good", declared=None)[::2] == (200, 3)
    assert seen == [3 * len(chunk)]
