// Batched request updates from the live service (status, attempts, results). A request in a
// terminal state (done, cancelled, failed) never changes again: its result is recorded once.
// @param rows: [{uid, status, attempts, output_tokens, queued_s, ttft_s, e2e_s, finished_at, error, ...}]
UNWIND $rows AS row
MATCH (r:Request {uid: row.uid})
WHERE NOT r.status IN ['done', 'cancelled', 'failed']
SET r += row
RETURN count(r) AS updated
