// Requests that end without a result (cancelled, or failed out of attempts), durable before the
// API answers, with the end of the lease that held them, if any (its Slice's end_s and end_wall,
// epoch seconds). A request already finished changes nothing and is left out of the answer. Also
// returns the [device_id, slice uid] pairs of the ended Slices (the caller refreshes those busy
// windows in the same transaction).
// @param rows: [{request: {uid, status, attempts, output_tokens, queued_s, ttft_s, e2e_s, finished_at, error}, slice_end: {uid, state, end_s, end_wall, busy_s, iterations, peak_bytes} or null}]
UNWIND $rows AS row
MATCH (r:Request {uid: row.request.uid})
WHERE NOT r.status IN ['done', 'cancelled', 'failed']
SET r += row.request
WITH r, row
CALL (row) {
  WITH row
  WHERE row.slice_end IS NOT NULL
  MATCH (s:Slice {uid: row.slice_end.uid})
  WHERE s.state <> 'done'
  SET s.state = row.slice_end.state, s.end_s = row.slice_end.end_s, s.end_wall = row.slice_end.end_wall
  WITH s
  OPTIONAL MATCH (s)-[:ON]->(d:Device)
  RETURN collect([d.device_id, s.uid]) AS devices
}
RETURN collect(r.uid) AS finished, reduce(acc = [], ds IN collect(devices) | acc + ds) AS touched
