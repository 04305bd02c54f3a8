// Restart reconciliation: Slices of the live service left open (no end) by a previous process
// are closed as 'abandoned' (their leases died with that process); their requests are queued
// again by the restart. Returns how many were closed.
// @param end_wall: epoch seconds, the end written on each
MATCH (s:Slice)
WHERE s.live AND s.end_wall IS NULL
SET s.state = 'abandoned', s.end_wall = $end_wall
RETURN count(s) AS closed
