"""The FastAPI application: factory, lifespan and error mapping. Routes: :mod:`service.api.routers`;
authentication and roles: :mod:`service.api.deps`.

``create_app(settings)`` builds an app whose lifespan starts a :class:`LiveService` (Neo4j
driver, state recovered from the GMG, writer, scheduler) and stops it. Every error leaves as
``{"error": {"kind", "message"}}`` with a 4xx status; an unexpected one is logged and is a 500
with no internals in it. On the OpenAI-compatible routes errors take OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) and a body that does not match the schema
is a 400, as OpenAI answers (:func:`service.api.openai.is_openai_route`). The OpenAPI document lists these answers on every operation
(:data:`ERROR_RESPONSES`), and a 405 names the path's methods in ``Allow``.
"""

from __future__ import annotations

import gc
import logging
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from neo4j.exceptions import ServiceUnavailable, SessionExpired
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.body_limit import BodyLimit
from service.api.deps import authenticate
from service.api.openai import error_body as openai_error
from service.api.openai import is_openai_route
from service.api.routers import ROUTERS
from service.api.schemas import ErrorOut
from service.domain.error import DatabaseUnavailableError, NotLeaderError, SliceschedError
from service.live.service import LiveService
from service.live.settings import ServiceSettings

log = logging.getLogger("slicesched.api")




#: The error answers every operation documents (one schema, ErrorOut); 405 is the router's, per path.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "Invalid input the schema cannot express (e.g. a prompt longer than "
                                            "the model's context, an unknown SLA class or status)"},
    401: {"model": ErrorOut, "description": "No key, or a key nobody holds"},
    403: {"model": ErrorOut, "description": "The key's role may not do this, or a write in read-only Cypher"},
    404: {"model": ErrorOut, "description": "No such object, or one the key may not see"},
    409: {"model": ErrorOut, "description": "Contradicts the current state (exists already, finished, not live)"},
    413: {"model": ErrorOut, "description": "The body is larger than the route takes (SLICESCHED_MAX_BODY_BYTES; "
                                            "the bulk routes: SLICESCHED_MAX_BULK_BODY_BYTES)"},
    429: {"model": ErrorOut, "description": "The model's queue is full (SLICESCHED_MAX_QUEUED), a quota is spent, or "
                                            "as many inspections run as may (SLICESCHED_MAX_INSPECTIONS); retry later"},
    422: {"model": ErrorOut, "description": "The body, path or query does not match the schema"},
    503: {"model": ErrorOut, "description": "Neo4j is unavailable; retry shortly"},
    500: {"model": ErrorOut, "description": "An unexpected error (logged on the server, nothing internal in it)"},
}


def errors_as_json(doc: dict[str, Any]) -> dict[str, Any]:
    """Error answers are JSON on every operation, also where success is not (``/metrics``): FastAPI
    documents a route's extra responses in the route's own media type. The OpenAI-compatible
    operations answer a body off the schema with a 400, never FastAPI's 422."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            if "openai" in operation.get("tags", ()):
                operation.get("responses", {}).pop("422", None)
            for status, response in operation.get("responses", {}).items():
                content = response.get("content")
                if not status.startswith("2") and content and "application/json" not in content:
                    response["content"] = {"application/json": next(iter(content.values()))}
    return doc


def _error(request: Request, status: int, kind: str, message: str, headers: dict[str, str] | None = None,
           param: str | None = None) -> JSONResponse:
    if is_openai_route(request):
        return JSONResponse(openai_error(status, kind, message, param), status_code=status, headers=headers)
    return JSONResponse({"error": {"kind": kind, "message": message}}, status_code=status, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """The documented methods of the request's path (Starlette's 405 names only the first route's):
    those of the most literal template it matches (``/v1/requests/batch``, not ``/v1/requests/{id}``)."""
    matches = [(template.count("{"), operations) for template, operations in request.app.openapi()["paths"].items()
               if _template_regex(template).fullmatch(request.url.path)]
    fewest = min((n for n, _ in matches), default=0)
    return sorted({m.upper() for n, operations in matches if n == fewest for m in operations})


@lru_cache(maxsize=256)
def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile("[^/]+".join(re.escape(part) for part in re.split(r"\{[^/}]+\}", template)))


def error_response(request: Request, exc: SliceschedError) -> JSONResponse:
    """A domain error's answer: the status and kind its class declares (service/domain/error.py)."""
    param = getattr(exc, "culprit", None)
    if exc.http_status is not None:
        retry = getattr(exc, "retry_after_s", None)
        headers = {"Retry-After": str(max(1, math.ceil(retry)))} if retry is not None else None
        if isinstance(exc, NotLeaderError):  # a client behind a Service reconnects, and may reach the leader
            headers = {**(headers or {}), "Connection": "close"}
        return _error(request, exc.http_status, exc.kind, str(exc), headers, param=param)
    log.error("unmapped domain error: %r", exc, exc_info=exc)
    return _error(request, 500, "internal", str(exc), param=param)


def install_error_handlers(app: FastAPI) -> None:
    async def domain(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SliceschedError)
        return error_response(request, exc)

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts, params = [], []
        for e in exc.errors()[:5]:
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
            params.append(where)
        status = 400 if is_openai_route(request) else 422
        return _error(request, status, "invalid_input", "; ".join(parts) or "invalid request",
                      param=params[0] if params else None)

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and (methods := allowed_methods(request)):
            headers["Allow"] = ", ".join(methods)
        return _error(request, exc.status_code, "http", str(exc.detail), headers)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return _error(request, 500, "internal", "internal error (logged on the server)")

    async def neo4j_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("Neo4j unavailable: %s", exc)
        retry = getattr(exc, "retry_after_s", 2.0)
        message = str(exc) if isinstance(exc, SliceschedError) else "Neo4j is unavailable; retry shortly"
        response = _error(request, 503, "unavailable", message)
        response.headers["Retry-After"] = str(max(1, round(retry)))
        return response

    app.add_exception_handler(DatabaseUnavailableError, neo4j_down)
    app.add_exception_handler(ServiceUnavailable, neo4j_down)
    app.add_exception_handler(SessionExpired, neo4j_down)
    app.add_exception_handler(SliceschedError, domain)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http)
    app.add_exception_handler(Exception, unexpected)


FULL_COLLECTION_AFTER = 1000
"""Young-generation collections between two full ones in ``slicesched serve`` (CPython's default:
10). A full collection walks every object the service accumulated since start-up (its requests,
leases and replicas: hundreds of thousands under load) and pauses the event loop 0.1-0.3 s; with
the start-up heap frozen it ran about once a second under load (a ``gc.callbacks`` probe: 91 in
90 s, 41 of them >= 50 ms). At 1,000 one runs every few seconds to minutes; the young
generations are collected as before, so cyclic garbage that dies young is freed as promptly.
Measured with benchmarks/lease_throughput.py (64 executors offering 1,500 leases/s): lease p99
129 and 144 ms at 10, 26 and 28 ms at 1,000 (2026-12-07, two runs each, quiet machine)."""


def create_app(settings: ServiceSettings | None = None, *, freeze_gc: bool = False) -> FastAPI:
    """The app; ``freeze_gc`` (``slicesched serve``: the process is the service's alone): once the
    service has started, what is alive then (imports, torch and the models, the recovered state)
    is moved out of the collector's reach for the process's life, so that a full collection no
    longer walks it: under load such collections had paused the event loop 0.2-0.3 s every few
    seconds (heartbeat p99 274 ms, then 25 ms; benchmarks/fleet.py at 50 GPUs); and full
    collections run after :data:`FULL_COLLECTION_AFTER` young ones, not 10."""
    resolved = settings or ServiceSettings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = LiveService(resolved)
        app.state.service = service
        await service.start()
        if freeze_gc:
            gc.collect()
            gc.freeze()
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="slicesched", version="0.1.0", lifespan=lifespan,
                  description="Operator-level scheduling for multi-tenant model serving: tenants, models, "
                              "requests, executor leases, what-if and Cypher inspection. See docs/API.md.")
    install_error_handlers(app)
    # bodies bounded before FastAPI reads them, and large ones read only for a known key
    routes = [route for router in ROUTERS for route in router.routes if isinstance(route, APIRoute)]
    app.add_middleware(BodyLimit, routes=routes, limit_bytes=resolved.max_body_bytes,
                       bulk_limit_bytes=resolved.max_bulk_body_bytes, authenticate=authenticate,
                       refuse=error_response)
    for router in ROUTERS:  # a router documenting its own errors (the OpenAI one) keeps them
        app.include_router(router, responses=None if router.responses else ERROR_RESPONSES)
    documented = app.openapi

    def openapi() -> dict[str, Any]:
        return app.openapi_schema or errors_as_json(documented())

    app.openapi = openapi  # type: ignore[method-assign]
    return app
