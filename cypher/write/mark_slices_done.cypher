// Mark slices done, with the measured end time when given, and refresh the busy windows cached on
// their devices: a done slice no longer blocks its device. Returns how many were found.
// @param rows: [{uid, end_s (or null to keep the planned end)}]
UNWIND $rows AS row
MATCH (s:Slice {uid: row.uid})-[:ON]->(d:Device)
SET s.state = 'done', s.end_s = coalesce(row.end_s, s.end_s)
WITH count(s) AS done, collect(DISTINCT d) AS touched
UNWIND touched AS d
CALL (d) {
  // Take the device's write lock first, so concurrent writers recompute one after another.
  SET d.busy_version = coalesce(d.busy_version, 0) + 1
  WITH d
  OPTIONAL MATCH (s:Slice)-[:ON]->(d)
  WHERE s.state IN ['placed', 'running']
  WITH d, s
  ORDER BY s.start_s
  WITH d, collect(s.start_s) AS starts, collect(s.end_s) AS ends
  SET d.busy_start_s = starts, d.busy_end_s = ends
}
RETURN done, count(d) AS devices
