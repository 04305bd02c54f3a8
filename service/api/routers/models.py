"""Models: register a built-in runnable model or a model directory (traced into the GMG), list, read.
The project's model resource is ``/v1/catalog/models``. ``POST /v1/models`` is a deprecated alias of
its registration (answered with ``Deprecation`` and a ``Link`` to the successor): ``GET /v1/models``
is the OpenAI-compatible listing (:mod:`service.api.routers.openai`), a different resource."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from service.api import reports
from service.api.deps import ManagePrincipal, ReadPrincipal, Svc
from service.api.responses import ModelOut
from service.api.schemas import ModelIn
from service.domain.error import ForbiddenError
from service.domain.principal import require, scoped_tenant
from service.live.audit import actor_of

router = APIRouter(tags=["models"])


@router.post("/v1/models", status_code=201, response_model=ModelOut, deprecated=True)
async def create_model_deprecated(body: ModelIn, svc: Svc, p: ManagePrincipal, response: Response) -> dict[str, Any]:
    """Deprecated: ``POST /v1/catalog/models``, which this does the same as."""
    response.headers["Deprecation"] = "true"
    response.headers["Link"] = '</v1/catalog/models>; rel="successor-version"'
    return await create_model(body, svc, p)


@router.post("/v1/catalog/models", status_code=201, response_model=ModelOut)
async def create_model(body: ModelIn, svc: Svc, p: ManagePrincipal) -> dict[str, Any]:
    """Register one of the built-in runnable models, or (admin keys) a Hugging Face model directory
    by ``path``; its operator graph is traced into the GMG."""
    tenant_id = scoped_tenant(p, body.tenant_id)
    if body.path is not None and not p.is_admin:
        raise ForbiddenError("registering a model by path takes an admin key (it names files on the service's "
                             "and executors' hosts)")
    model = await svc.registration.create_model(actor_of(p), tenant_id, body.model_id, body.family, body.seed,
                                                body.replicas, body.path)
    return reports.model_public(model)


@router.get("/v1/catalog/models", response_model=list[ModelOut])
async def list_models(svc: Svc, p: ReadPrincipal, tenant_id: str | None = None) -> list[dict[str, Any]]:
    if p.is_tenant:  # a tenant sees its own; an admin every tenant's, or the one it names
        tenant_id = scoped_tenant(p, tenant_id)
    else:
        require(p, "admin")
    return [reports.model_public(m) for m in svc.reads.models(tenant_id)]


@router.get("/v1/catalog/models/{model_id}", response_model=ModelOut)
async def get_model(model_id: str, svc: Svc, p: ReadPrincipal, tenant_id: str | None = None) -> dict[str, Any]:
    return reports.model_public(svc.reads.model(scoped_tenant(p, tenant_id), model_id))
