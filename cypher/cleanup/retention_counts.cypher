// Retention's plan: how many finished requests and ended workflows finished before their
// cutoffs, and how many audit entries were recorded before its cutoff (what a run would
// archive and delete, the audit chain's newest entry always kept).
// @param requests_before: epoch seconds
// @param workflows_before: epoch seconds
// @param audit_before: epoch seconds
CALL {
  MATCH (r:Request)
  WHERE r.finished_at < $requests_before AND r.status IN ['done', 'failed', 'cancelled']
  RETURN count(r) AS requests
}
CALL {
  MATCH (w:Workflow)
  WHERE w.finished_at < $workflows_before AND w.status IN ['done', 'failed', 'cancelled']
  RETURN count(w) AS workflows
}
CALL {
  MATCH (e:AuditEntry)
  WHERE e.at < $audit_before
  RETURN count(e) AS audit_entries
}
RETURN requests, workflows, audit_entries
