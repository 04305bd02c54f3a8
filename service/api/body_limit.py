"""Request bodies bounded before they are read (a pure ASGI middleware, outside FastAPI's body
parsing).

FastAPI reads a whole body before it resolves a route's dependencies, so without this a client
with no key could make the service buffer any number of bytes before its 401 (hand probes of
issue 41: one 200 MB body without a key took the service to 2.3 GB). Here, before the app sees
the request:

- a body of at most :data:`PREAUTH_BYTES` (every route takes one: the smallest limit is larger)
  passes untouched: the common case costs one look at the headers;
- a declared ``Content-Length`` above its route's limit is refused at once with 413; the bulk
  routes (:data:`BULK_ROUTES`) take the larger limit;
- a larger body, or one of unknown length (chunked), is read only after its key is known, on every
  route that takes a key (an unknown key is the 401 it would have been, unread);
- a chunked body is counted as it streams and refused with 413 the moment it passes its limit
  (the app then sees the client leave).

The answers have the app's error shape (``refuse``: :func:`service.api.app.error_response`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.domain.error import PayloadTooLargeError, SliceschedError

PREAUTH_BYTES = 64 * 1024  # a body over this (or of unknown length) is read only once its key is known
#: Routes whose bodies are batches: many requests, completions, progress updates, workflow documents.
BULK_ROUTES = frozenset({("POST", "/v1/requests/batch"), ("POST", "/v1/leases/complete"),
                         ("POST", "/v1/leases/progress"), ("POST", "/v1/workflows")})


class BodyLimit:
    """``limit_bytes``: every route's body limit but :data:`BULK_ROUTES`' (``bulk_limit_bytes``);
    ``routes``: the app's routes, in its order (those depending on ``authenticate``, which raises a
    :class:`SliceschedError` for an unknown key, take a key); ``refuse``: the error answer."""

    def __init__(self, app: ASGIApp, *, routes: Sequence[APIRoute], limit_bytes: int, bulk_limit_bytes: int,
                 authenticate: Callable[[Request], Awaitable[Any]],
                 refuse: Callable[[Request, SliceschedError], Response]) -> None:
        assert PREAUTH_BYTES <= limit_bytes <= bulk_limit_bytes
        self.app = app
        self.routes = tuple(routes)
        self.limit_bytes = limit_bytes
        self.bulk_limit_bytes = bulk_limit_bytes
        self.authenticate = authenticate
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value) if value.isdigit() else None  # the server refuses a malformed one
            elif name == b"transfer-encoding":
                chunked = True
        if not chunked and (length is None or length <= PREAUTH_BYTES):
            await self.app(scope, receive, send)  # no body, or one every route takes
            return
        request = Request(scope)
        route = self._route(scope)
        bulk = route is not None and (request.method, route.path) in BULK_ROUTES
        limit = self.bulk_limit_bytes if bulk else self.limit_bytes
        if length is not None and length > limit:
            await self._respond(request, self._too_large(request, f"{length:,} bytes", limit, bulk), scope, send)
            return
        if route is not None and _takes_key(route.dependant, self.authenticate):
            try:
                await self.authenticate(request)
            except SliceschedError as exc:
                await self._respond(request, exc, scope, send)
                return
        if not chunked:
            await self.app(scope, receive, send)  # the server delivers no more than the declared length
            return
        await self._counted(request, scope, receive, send, limit, bulk)

    async def _counted(self, request: Request, scope: Scope, receive: Receive, send: Send, limit: int,
                       bulk: bool) -> None:
        received = 0
        refused = False
        started = False

        async def counting() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        exc = self._too_large(request, f"more than {limit:,} bytes", limit, bulk)
                        await self._respond(request, exc, scope, send)
                    return {"type": "http.disconnect"}  # the app sees the client leave
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out already; what the app answers to the "disconnect" is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting, guarded)
        except ClientDisconnect:
            if not refused:
                raise  # a client that did leave

    def _route(self, scope: Scope) -> APIRoute | None:
        for route in self.routes:
            if route.matches(scope)[0] == Match.FULL:
                return route
        return None

    @staticmethod
    def _too_large(request: Request, size: str, limit: int, bulk: bool) -> PayloadTooLargeError:
        setting = "SLICESCHED_MAX_BULK_BODY_BYTES" if bulk else "SLICESCHED_MAX_BODY_BYTES"
        return PayloadTooLargeError(f"request body too large: {size}; {request.method} {request.url.path} takes at "
                                    f"most {limit:,} bytes ({setting})")

    async def _respond(self, request: Request, exc: SliceschedError, scope: Scope, send: Send) -> None:
        response = self.refuse(request, exc)
        response.headers["Connection"] = "close"  # the unread rest of the body ends the connection

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)


def _takes_key(dependant: Dependant, authenticate: Callable[..., Any]) -> bool:
    """Whether a route (through any of its dependencies) authenticates its caller."""
    return any(d.call is authenticate or _takes_key(d, authenticate) for d in dependant.dependencies)
