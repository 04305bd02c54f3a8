// Renewals of live leases past their expected end: a running Slice's window end (end_s, epoch
// seconds) moves to the renewal's horizon, so the candidate-slot search keeps its devices busy
// while the lease runs on. Never earlier; a Slice no longer running is left alone. Batched.
// Returns how many moved and the [device_id, slice uid] pairs (the caller refreshes those busy
// windows in the same transaction).
// @param rows: [{uid, end_s}]
UNWIND $rows AS row
MATCH (s:Slice {uid: row.uid})
WHERE s.state = 'running' AND s.end_s < row.end_s
SET s.end_s = row.end_s
WITH s
OPTIONAL MATCH (s)-[:ON]->(d:Device)
RETURN count(DISTINCT s) AS extended, collect([d.device_id, s.uid]) AS touched
