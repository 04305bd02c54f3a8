// Bounded retention of the live service's Slices: delete those that ended before $before_wall
// (epoch seconds), at most $limit per call; run until it returns 0. Requests are kept. A seek on
// the end_wall index: the cost follows what is deleted, not the millions of slices kept.
// @param before_wall: epoch seconds
// @param limit: slices per call
MATCH (s:Slice)
WHERE s.end_wall < $before_wall AND s.live
WITH s LIMIT $limit
DETACH DELETE s
RETURN count(*) AS deleted
