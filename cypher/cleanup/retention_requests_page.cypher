// Retention: the oldest finished requests (done, failed or cancelled) that finished before
// $before (epoch seconds), at most $limit, oldest first, each with every property (prompt and
// result included): what the archive keeps of them before they are deleted.
// @param before: epoch seconds
// @param limit: requests per page
MATCH (r:Request)
WHERE r.finished_at < $before AND r.status IN ['done', 'failed', 'cancelled']
WITH r
ORDER BY r.finished_at, r.uid
LIMIT $limit
RETURN collect(properties(r)) AS rows
