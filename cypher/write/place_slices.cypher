// Place slices: create or move each Slice (state 'placed') ON its device, then its DEPENDS_ON
// edges to producer slices (which may be in the same batch), then refresh the busy windows cached
// on every device touched (Device.busy_start_s / busy_end_s: its live slices' windows sorted by
// start, read by find_candidate_slots). Returns how many were placed; a row naming an unknown
// device is skipped, so the caller compares `placed` with its row count.
// @param rows: [{uid, tenant_id, model_uid, device_id, start_s, end_s, resident_bytes, depends_on: [producer uid]}]
CALL () {
  UNWIND $rows AS row
  MATCH (d:Device {device_id: row.device_id})
  MERGE (s:Slice {uid: row.uid})
  SET s.tenant_id = row.tenant_id, s.model_uid = row.model_uid, s.device_id = row.device_id,
      s.start_s = row.start_s, s.end_s = row.end_s, s.resident_bytes = row.resident_bytes, s.state = 'placed'
  WITH s, d
  CALL (s) {
    OPTIONAL MATCH (s)-[old:ON]->(o:Device)
    DELETE old
    RETURN collect(o) AS left
  }
  CREATE (s)-[:ON]->(d)
  RETURN count(s) AS placed, collect(d) + reduce(acc = [], ds IN collect(left) | acc + ds) AS touched
}
CALL () {
  UNWIND $rows AS row
  UNWIND coalesce(row.depends_on, []) AS producer_uid
  MATCH (s:Slice {uid: row.uid})
  MATCH (p:Slice {uid: producer_uid})
  MERGE (s)-[:DEPENDS_ON]->(p)
  RETURN count(*) AS dependencies
}
UNWIND touched AS d
WITH DISTINCT placed, dependencies, d
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
RETURN placed, dependencies, count(d) AS devices
