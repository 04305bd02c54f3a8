// Retention of a planner's slices: delete done slices that ended before $before_s, at most $limit
// per call; run until it returns 0. The live service's slices (s.live, epoch seconds) have their
// own retention: delete_old_live_slices.
// @param before_s: horizon, seconds
// @param limit: slices per chunk
MATCH (s:Slice {state: 'done'})
WHERE s.end_s < $before_s AND s.live IS NULL
WITH s LIMIT $limit
DETACH DELETE s
RETURN count(*) AS deleted
