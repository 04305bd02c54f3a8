// Retention: delete done slices that ended before $before_s, at most $limit per call; run until
// it returns 0.
// @param before_s: horizon, seconds
// @param limit: slices per chunk
MATCH (s:Slice {state: 'done'})
WHERE s.end_s < $before_s
WITH s LIMIT $limit
DETACH DELETE s
RETURN count(*) AS deleted
