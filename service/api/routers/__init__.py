"""One router per resource; :func:`service.api.app.create_app` includes them in :data:`ROUTERS` order."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.routers import audit, executors, keys, leases, models, ops, requests, scheduling, tenants

ROUTERS: tuple[APIRouter, ...] = (ops.router, tenants.router, models.router, executors.router, requests.router,
                                  leases.router, scheduling.router, keys.router, audit.router)
