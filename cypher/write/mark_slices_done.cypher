// Mark slices done, with the measured end time when given: a done slice no longer blocks its
// device. Returns how many were found and the [device_id, slice uid] pairs (the caller refreshes
// those busy windows in the same transaction: refresh_busy_windows).
// @param rows: [{uid, end_s (or null to keep the planned end)}]
UNWIND $rows AS row
MATCH (s:Slice {uid: row.uid})-[:ON]->(d:Device)
SET s.state = 'done', s.end_s = coalesce(row.end_s, s.end_s)
RETURN count(DISTINCT s) AS done, collect([d.device_id, s.uid]) AS touched
