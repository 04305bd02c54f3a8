// Accept workflows: each Workflow node with its validated document (JSON text), its inputs'
// texts, SLO, project and submit time, and one WorkflowStep per step (all pending), linked
// HAS_STEP. Written before the API answers 202, so an accepted workflow survives a restart. A
// workflow whose uid exists creates nothing (its id is taken); `created` lists the uids created.
// @param rows: [{workflow: {uid, tenant_id, workflow_id, project_id, shape, slo_s, created_at, status, version, document, input_text}, steps: [{uid, tenant_id, workflow_uid, step_id, kind, role, position, status, ...}]}]
UNWIND $rows AS row
OPTIONAL MATCH (old:Workflow {uid: row.workflow.uid})
CALL (row, old) {
  WITH row, old
  WHERE old IS NULL
  CREATE (w:Workflow {uid: row.workflow.uid})
  SET w += row.workflow
  WITH w, row
  UNWIND row.steps AS st
  CREATE (s:WorkflowStep {uid: st.uid})
  SET s += st
  CREATE (w)-[:HAS_STEP]->(s)
}
RETURN collect(CASE WHEN old IS NULL THEN row.workflow.uid END) AS created
