// Restart reconciliation: Slices of the live service left open (no end) by a previous process
// are closed as 'abandoned' (their leases died with that process; their windows end now, so
// their devices are free again); their requests are queued again by the restart. Returns how
// many were closed and the [device_id, slice uid] pairs (the caller refreshes those busy windows
// in the same transaction).
// @param end_wall: epoch seconds, the end written on each
MATCH (s:Slice)
WHERE s.live AND s.end_wall IS NULL
SET s.state = 'abandoned', s.end_wall = $end_wall, s.end_s = $end_wall
WITH s
OPTIONAL MATCH (s)-[:ON]->(d:Device)
RETURN count(DISTINCT s) AS closed, collect([d.device_id, s.uid]) AS touched
