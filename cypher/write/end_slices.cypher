// The end of live leases: state (expired, failed, cancelled), end (epoch seconds: end_s, the
// window the busy-window cache reads, and end_wall) and observation. Batched. A Slice already
// done (written with its completion) never changes again. Returns how many ended and the
// [device_id, slice uid] pairs (the caller refreshes those busy windows in the same transaction).
// @param rows: [{uid, state, end_s, end_wall, busy_s, iterations, peak_bytes}]
UNWIND $rows AS row
MATCH (s:Slice {uid: row.uid})
WHERE s.state <> 'done'
SET s.state = row.state, s.end_s = row.end_s, s.end_wall = row.end_wall, s.busy_s = row.busy_s,
    s.iterations = row.iterations, s.peak_bytes = row.peak_bytes
WITH s
OPTIONAL MATCH (s)-[:ON]->(d:Device)
RETURN count(DISTINCT s) AS ended, collect([d.device_id, s.uid]) AS touched
