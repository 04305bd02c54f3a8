// The end of live leases: state (expired, failed, cancelled), wall-clock end and observation.
// Batched. A Slice already done (written with its completion) never changes again.
// @param rows: [{uid, state, end_wall, busy_s, iterations, peak_bytes}]
UNWIND $rows AS row
MATCH (s:Slice {uid: row.uid})
WHERE s.state <> 'done'
SET s.state = row.state, s.end_wall = row.end_wall, s.busy_s = row.busy_s, s.iterations = row.iterations,
    s.peak_bytes = row.peak_bytes
RETURN count(s) AS ended
