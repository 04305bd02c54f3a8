// Workflow progress: a whole snapshot of each workflow's state and its steps' (status, request
// id, timings, output text, detail as JSON text). A row applies only when its `version` is newer
// than the stored one (a batched snapshot that lost a race with a durable one changes nothing),
// and an ended workflow (done, failed, cancelled) takes only rows of that same status. A step's
// request is linked CALLS. Returns the uids updated.
// @param rows: [{workflow: {uid, status, version, finished_at, error}, steps: [{uid, status, request_id, started_at, finished_at, text, output_tokens, error, detail}]}]
UNWIND $rows AS row
MATCH (w:Workflow {uid: row.workflow.uid})
WHERE coalesce(w.version, 0) < row.workflow.version
  AND (w.status = 'running' OR w.status = row.workflow.status)
SET w += row.workflow
WITH w, row
CALL (w, row) {
  UNWIND row.steps AS st
  MATCH (w)-[:HAS_STEP]->(s:WorkflowStep {uid: st.uid})
  SET s += st
  WITH s, st
  OPTIONAL MATCH (r:Request {uid: st.request_id})
  FOREACH (_ IN CASE WHEN r IS NULL THEN [] ELSE [1] END | MERGE (s)-[:CALLS]->(r))
}
RETURN collect(w.uid) AS updated
