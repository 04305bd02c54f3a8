// Workflows of the live service for restart recovery: every one still running, and those that
// ended since $since (readable after a restart, as finished requests are), each with its steps.
// One ended without an end time (a cancel written, its steps' end not yet) is always loaded.
// @param since: epoch seconds; workflows that ended before this are not loaded
MATCH (w:Workflow)
WHERE w.status = 'running' OR w.finished_at IS NULL OR w.finished_at >= $since
RETURN w {.*, steps: COLLECT { MATCH (w)-[:HAS_STEP]->(s:WorkflowStep) RETURN s {.*} }} AS workflow
ORDER BY w.created_at
