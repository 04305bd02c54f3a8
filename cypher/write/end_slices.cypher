// The end of live leases: state (done, expired, failed, cancelled) and wall-clock end. Batched.
// @param rows: [{uid, state, end_wall}]
UNWIND $rows AS row
MATCH (s:Slice {uid: row.uid})
SET s.state = row.state, s.end_wall = row.end_wall
RETURN count(s) AS ended
