// Retention: the oldest ended workflows (done, failed or cancelled) that finished before $before
// (epoch seconds), at most $limit, oldest first, each with every property and its steps'.
// @param before: epoch seconds
// @param limit: workflows per page
MATCH (w:Workflow)
WHERE w.finished_at < $before AND w.status IN ['done', 'failed', 'cancelled']
WITH w
ORDER BY w.finished_at, w.uid
LIMIT $limit
OPTIONAL MATCH (w)-[:HAS_STEP]->(s:WorkflowStep)
WITH w, collect(properties(s)) AS steps
ORDER BY w.finished_at, w.uid
RETURN collect(w {.*, steps: steps}) AS rows
