// Bounded retention of the live service's Slices: delete those that ended before $before_wall
// (epoch seconds), at most $limit per call; run until it returns 0. Requests are kept.
// @param before_wall: epoch seconds
// @param limit: slices per call
MATCH (s:Slice)
WHERE s.live AND s.end_wall IS NOT NULL AND s.end_wall < $before_wall
WITH s LIMIT $limit
DETACH DELETE s
RETURN count(*) AS deleted
