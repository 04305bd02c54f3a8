"""The live distributional predictor (admin): its state, a refit now, the observations export
(:mod:`service.live.predictors`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from service.api.deps import AdminPrincipal, Svc
from service.api.responses import PredictorOut
from service.live import threads
from service.live.audit import actor_of

router = APIRouter(tags=["predictors"])


@router.get("/v1/predictors", response_model=PredictorOut)
async def predictor_state(svc: Svc, _: AdminPrincipal) -> dict[str, Any]:
    """Admin: the predictor answering (version, digest), its observations, the last refit and
    the calibration of each quantile on that refit's held-out observations."""
    return svc.predictors.public()


@router.post("/v1/predictors/refit", response_model=PredictorOut)
async def refit_predictor(svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: refit now on the observations kept (whatever ``min_new`` says) and swap the new
    model in; 409 without a predictor or without any call observation."""
    before = svc.predictors.version
    report = await svc.predictors.refit()
    await svc.audit.append(actor_of(p), "predictor.refit", "service", before={"version": before},
                           after={"version": report["version"], "seed": report["seed"]})
    return svc.predictors.public()


@router.get("/v1/predictors/observations", response_class=Response,
            responses={200: {"description": "JSON lines, the records format of `slicesched predictors record` "
                                            "(`slicesched predictors train FILE` reads it)",
                             "content": {"application/x-ndjson": {"schema": {
                                 "type": "string", "description": "one JSON record per line"}}}}})
async def export_observations(svc: Svc, _: AdminPrincipal,
                              limit: Annotated[int | None, Query(ge=1, le=1_000_000,
                                                                 description="the newest N only")] = None) -> Response:
    """Admin: the recorded observations of finished workflow steps (written within about a second
    of each step's end), oldest first."""
    await svc.predictors.flush()
    text = await threads.run(svc.predictors.read_file, limit)
    return Response(text, media_type="application/x-ndjson")
