"""Workflows: a DAG of a tenant's model calls and tool calls with one end-to-end SLO, run live
(:mod:`service.live.workflows`; the document: :mod:`service.domain.workflow`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from service.api.deps import ReadPrincipal, SubmitPrincipal, Svc
from service.api.responses import WorkflowOut
from service.domain.error import InvalidInputError, NotFoundError
from service.domain.principal import Principal, scoped_tenant
from service.domain.workflow import Workflow
from service.live.audit import actor_of
from service.live.service import LiveService
from service.live.workflows import WorkflowRun

router = APIRouter(tags=["workflows"])
WORKFLOW_STATES = ("running", "done", "failed", "cancelled")

WorkflowDoc = Annotated[dict[str, Any], Body(description=(
    "the workflow document (service/domain/workflow.py, docs/API.md \"Workflows\"), and optionally "
    "`input_text` (input name -> its text, pasted where a prompt reads it) and `project_id`"))]


@router.post("/v1/workflows", status_code=202, response_model=WorkflowOut)
async def submit_workflow(body: WorkflowDoc, svc: Svc, p: SubmitPrincipal) -> dict[str, Any]:
    """Validate the DAG (cycles, unknown steps, missing inputs, the tenant's models: a 400 naming
    the culprit, nothing started) and run it: each step when the steps it uses are done."""
    doc = dict(body)
    input_text = doc.pop("input_text", {}) or {}
    if not isinstance(input_text, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in input_text.items()):
        raise InvalidInputError("input_text must be an object of input name -> text")
    asked_project = doc.pop("project_id", None)
    if asked_project is not None and not isinstance(asked_project, str):
        raise InvalidInputError("project_id must be a string")
    given = doc.get("tenant_id")
    tenant_id = scoped_tenant(p, given if isinstance(given, str) else None)
    doc["tenant_id"] = tenant_id
    doc.setdefault("inputs", {})
    if isinstance(doc["inputs"], dict):  # an input given as text but not sized: its size is its text's
        for name, text in input_text.items():
            doc["inputs"].setdefault(name, len(text.encode()))
    workflow = Workflow.from_dict(doc)
    project_id = svc.intake.project_of(p, tenant_id, asked_project)
    run = await svc.workflows.submit(actor_of(p), workflow, project_id, input_text)
    return run.public()


@router.get("/v1/workflows", response_model=list[WorkflowOut])
async def list_workflows(svc: Svc, p: ReadPrincipal,
                         status: Annotated[str | None, Query(json_schema_extra={
                             "enum": list(WORKFLOW_STATES)})] = None,
                         limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    if status is not None and status not in WORKFLOW_STATES:
        raise InvalidInputError(f"unknown status {status!r} (valid: {', '.join(WORKFLOW_STATES)})")
    tenant = p.tenant_id if p.is_tenant else None
    runs = [r for r in svc.workflows.runs.values()
            if (tenant is None or r.tenant_id == tenant) and (status is None or r.status == status)
            and (not p.projects or r.project_id in p.projects)]
    return [r.public() for r in runs[-limit:]]


@router.get("/v1/workflows/{workflow_id}", response_model=WorkflowOut)
async def get_workflow(workflow_id: str, svc: Svc, p: ReadPrincipal) -> dict[str, Any]:
    """Its status and each step's: state, request id, start and end (seconds from submission)."""
    return _visible(svc, p, workflow_id).public()


@router.post("/v1/workflows/{workflow_id}/cancel", response_model=WorkflowOut)
async def cancel_workflow(workflow_id: str, svc: Svc, p: SubmitPrincipal) -> dict[str, Any]:
    """Cancel its running steps (requests cancelled, tool processes killed) and every step not
    started; 409 if it already ended."""
    run = _visible(svc, p, workflow_id)
    await svc.workflows.cancel(actor_of(p), run)
    return run.public()


def _visible(svc: LiveService, p: Principal, workflow_id: str) -> WorkflowRun:
    run = svc.workflows.get(p.tenant_id if p.is_tenant else None, workflow_id)
    if p.projects and run.project_id not in p.projects:
        raise NotFoundError(f"no workflow {workflow_id!r}")
    return run
