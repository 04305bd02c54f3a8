"""The workflow store on the real Neo4j: a workflow is created once (a taken uid creates
nothing), a snapshot older than the stored one changes nothing, an ended workflow takes only
rows of its own status, a step's request is linked, and a restart reads back what was written."""

from __future__ import annotations

from typing import Any

import pytest

from service.graph.repository import GraphRepository

pytestmark = pytest.mark.neo4j


def _rows(tenant: str, version: int, status: str = "running", step: str = "pending",
          request_id: str | None = None) -> dict[str, Any]:
    uid = f"{tenant}/w"
    return {"workflow": {"uid": uid, "status": status, "version": version, "finished_at": None, "error": None},
            "steps": [{"uid": f"{uid}/a", "status": step, "request_id": request_id, "started_at": None,
                       "finished_at": None, "text": step, "output_tokens": 0, "error": None, "detail": "{}"}]}


def _create(tenant: str) -> dict[str, Any]:
    row = _rows(tenant, 1)
    row["workflow"] |= {"tenant_id": tenant, "workflow_id": "w", "project_id": "default", "shape": None,
                        "slo_s": 10.0, "created_at": 100.0, "document": "{}", "input_text": "{}"}
    row["steps"][0] |= {"tenant_id": tenant, "workflow_uid": f"{tenant}/w", "step_id": "a", "kind": "model",
                        "role": "coder", "position": 0}
    return row


def _stored(repo: GraphRepository, tenant: str) -> dict[str, Any]:
    (wf,) = [w for w in repo.workflows.live_workflows(0.0) if w["tenant_id"] == tenant]
    return wf


def test_snapshots_apply_in_version_order_and_an_end_is_final(repo: GraphRepository, tenant: str) -> None:
    uid = f"{tenant}/w"
    try:
        assert repo.workflows.create_workflows([_create(tenant)]) == {uid}
        assert repo.workflows.create_workflows([_create(tenant)]) == set()  # the uid is taken
        assert repo.workflows.update_workflows([_rows(tenant, 3, step="done")]) == {uid}
        assert repo.workflows.update_workflows([_rows(tenant, 2, step="running")]) == set()  # late batch: no undo
        assert _stored(repo, tenant)["steps"][0]["status"] == "done"
        assert repo.workflows.update_workflows([_rows(tenant, 4, status="cancelled", step="cancelled")]) == {uid}
        assert repo.workflows.update_workflows([_rows(tenant, 5, status="done", step="done")]) == set()  # ended: final
        assert repo.workflows.update_workflows([_rows(tenant, 6, status="cancelled", step="cancelled")]) == {uid}
        wf = _stored(repo, tenant)
        assert (wf["status"], wf["version"], wf["steps"][0]["status"], wf["created_at"]) == ("cancelled", 6,
                                                                                             "cancelled", 100.0)
        with repo.driver.session() as s:
            s.run("CREATE (:Request {uid: $uid, tenant_id: $tenant})", uid=f"{tenant}-r", tenant=tenant).consume()
        repo.workflows.update_workflows([_rows(tenant, 7, status="cancelled", step="cancelled", request_id=f"{tenant}-r")])
        with repo.driver.session() as s:
            linked = s.run("MATCH (:Workflow {uid: $uid})-[:HAS_STEP]->(:WorkflowStep)-[:CALLS]->(r:Request) "
                           "RETURN collect(r.uid) AS r", uid=uid).single()
        assert linked is not None and linked["r"] == [f"{tenant}-r"]
    finally:
        repo.models.delete_tenant(tenant)
    assert [w for w in repo.workflows.live_workflows(0.0) if w["tenant_id"] == tenant] == []  # they go with their tenant
