// Requests that end without a result (cancelled, or failed out of attempts), durable before the
// API answers, with the end of the lease that held them, if any. A request already finished
// changes nothing and is left out of the answer.
// @param rows: [{request: {uid, status, attempts, output_tokens, queued_s, ttft_s, e2e_s, finished_at, error}, slice_end: {uid, state, end_wall, busy_s, iterations, peak_bytes} or null}]
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
  SET s.state = row.slice_end.state, s.end_wall = row.slice_end.end_wall
}
RETURN collect(r.uid) AS finished
