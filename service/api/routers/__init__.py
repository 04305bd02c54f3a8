"""One router per resource; :func:`service.api.app.create_app` includes them in :data:`ROUTERS` order
(a router that documents its own error answers, the OpenAI-compatible one, keeps them)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.routers import (
    access,
    audit,
    executors,
    experiments,
    keys,
    leases,
    models,
    onboarding,
    openai,
    ops,
    predictors,
    requests,
    scheduling,
    tenants,
    workflows,
)

ROUTERS: tuple[APIRouter, ...] = (ops.router, tenants.router, models.router, executors.router, requests.router,
                                  leases.router, scheduling.router, keys.router, access.router, onboarding.router,
                                  openai.router, audit.router, experiments.router, workflows.router,
                                  predictors.router)
