"""Health, readiness, Prometheus metrics and the admin's stats."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from service.api import reports
from service.api.deps import AdminPrincipal, Svc
from service.api.responses import HealthOut, ReadinessOut, StatsOut

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=HealthOut)
async def healthz(svc: Svc) -> dict[str, Any]:
    """Liveness (the process answers; 200 while it runs), with readiness in one word and
    nothing about tenants (no key needed). ``/readyz`` has the details."""
    ready = svc.readiness()["ready"]
    return {"status": "ok" if ready else "degraded", "ready": ready, "neo4j": "up" if svc.db_up else "down",
            "placement": svc.settings.placement, "queue": svc.settings.queue}


@router.get("/readyz", response_model=ReadinessOut,
            responses={503: {"model": ReadinessOut, "description": "Not ready (Neo4j down, a loop stuck, the lease "
                                                                 "path's calls failing); retry shortly"}})
async def readyz(svc: Svc, response: Response) -> dict[str, Any]:
    """Readiness: 200 when Neo4j answers, no background loop is stuck and the lease path's calls
    (submissions, completions) are not failing, else 503; each
    loop's last successful tick and failures, the GMG writer's backlog (no key needed; nothing
    about tenants)."""
    report = svc.readiness()
    report["unplaced_models"] = len(report["unplaced_models"])  # model names stay admin-only (/v1/stats)
    if not report["ready"]:
        response.status_code = 503
        response.headers["Retry-After"] = "2"
    return report


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text exposition format, version 0.0.4"}})
async def metrics(svc: Svc, _: AdminPrincipal) -> Response:
    """Prometheus text format; admin key (the labels name tenants). Configure the scrape job
    with ``authorization: {credentials: <admin key>}``."""
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/stats", response_model=StatsOut)
async def stats(svc: Svc, _: AdminPrincipal) -> dict[str, Any]:
    """Admin: counters, GMG write lag and the scheduler's recent decisions."""
    return reports.stats(svc)
