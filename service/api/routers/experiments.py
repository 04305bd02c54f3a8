"""Experiment records over HTTP (what ``slicesched experiments list|show|compare`` prints): a
tenant's keys read the experiments run for their tenant (a key limited to projects: those
projects'), admin keys every one. A record another tenant ran reads as one that does not exist.
Records are written by the runs themselves (``slicesched replay --record --for-tenant T
--project P``); see the README's "Experiments"."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.deps import ReadPrincipal, Svc
from service.api.responses import ExperimentComparisonOut, ExperimentOut, ExperimentSummaryOut
from service.domain.error import InvalidInputError, NotFoundError
from service.domain.experiment import KINDS, Experiment, comparison, record_doc
from service.domain.principal import Principal

router = APIRouter(tags=["experiments"])


def _visible(p: Principal, e: Experiment | dict[str, Any]) -> bool:
    tenant, project = (e.tenant_id, e.project) if isinstance(e, Experiment) else (e["tenant_id"], e["project"])
    if not p.is_tenant:
        return True  # a platform key (ReadPrincipal admits admin only)
    return tenant == p.tenant_id and (not p.projects or project in p.projects)


async def _get(svc: Any, p: Principal, uid: str) -> Experiment:
    """The record, if the key may read it; else the same 404 as for one that does not exist."""
    e: Experiment = await svc.reads.experiment(uid)  # NotFoundError when absent
    if not _visible(p, e):
        raise NotFoundError(f"no experiment {uid!r}")
    return e


@router.get("/v1/experiments", response_model=list[ExperimentSummaryOut])
async def list_experiments(
    svc: Svc, p: ReadPrincipal,
    project: Annotated[str | None, Query(max_length=64, description="only this project's")] = None,
    kind: Annotated[str | None, Query(json_schema_extra={"enum": list(KINDS)})] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Newest first: the caller's tenant's experiments (admin: every one)."""
    if kind is not None and kind not in KINDS:
        raise InvalidInputError(f"unknown experiment kind {kind!r} (known: {', '.join(KINDS)})")
    rows = await svc.reads.experiments(
        project=project, kind=kind, limit=limit,
        tenant_id=p.tenant_id if p.is_tenant else None, projects=list(p.projects) if p.projects else None)
    return [r for r in rows if _visible(p, r)]


@router.get("/v1/experiments/{uid}", response_model=ExperimentOut)
async def get_experiment(uid: str, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    """The whole record: configuration, code version, data digests, cost model, results, plots."""
    return record_doc(await _get(svc, p, uid))


@router.get("/v1/experiments/{uid}/compare", response_model=ExperimentComparisonOut)
async def compare_experiments(
    uid: str, svc: Svc, p: ReadPrincipal,
    other: Annotated[str, Query(min_length=1, max_length=200, description="the experiment to compare it with (B)")],
) -> dict[str, Any]:
    """What differs between this experiment (A) and ``other`` (B): configuration, data digests,
    and the headline figures per policy and load side by side."""
    return comparison(await _get(svc, p, uid), await _get(svc, p, other))
