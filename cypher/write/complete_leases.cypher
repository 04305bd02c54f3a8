// Completed leases, durable in one statement: the request's result and final state, and its
// Slice done with its end (start_s/end_s and start_wall/end_wall, epoch seconds: its real window)
// and the executor's observation (the Slice is created here if the batched writer has not written
// it yet). A request already finished changes nothing and its row is left out of the answer: a
// result is recorded once, with exactly one done Slice. Also returns the [device_id, slice uid]
// pairs of the completed Slices (the caller refreshes those busy windows in the same transaction).
// @param rows: [{request: {uid, status, attempts, output_tokens, queued_s, ttft_s, e2e_s, finished_at, error}, slice: {uid, tenant_id, model_uid, device_ids, executor_id, start_s, end_s, start_wall, end_wall, busy_s, iterations, peak_bytes}}]
UNWIND $rows AS row
MATCH (r:Request {uid: row.request.uid})
WHERE NOT r.status IN ['done', 'cancelled', 'failed']
// The Slice is locked before the request, in the order the batched writer's create_slices takes
// them (MERGE, then SERVES), so the two never deadlock.
MERGE (s:Slice {uid: row.slice.uid})
ON CREATE SET s.tenant_id = row.slice.tenant_id, s.model_uid = row.slice.model_uid,
              s.executor_id = row.slice.executor_id, s.start_s = row.slice.start_s,
              s.start_wall = row.slice.start_wall, s.live = true, s.fresh = true
SET s.state = 'done', s.end_s = row.slice.end_s, s.end_wall = row.slice.end_wall, s.busy_s = row.slice.busy_s,
    s.iterations = row.slice.iterations, s.peak_bytes = row.slice.peak_bytes
SET r += row.request
WITH r, s, row
CALL (r, s, row) {
  WITH r, s, row
  WHERE s.fresh
  REMOVE s.fresh
  CREATE (s)-[:SERVES]->(r)
  WITH s, row
  UNWIND row.slice.device_ids AS device_id
  MATCH (d:Device {device_id: device_id})
  CREATE (s)-[:ON]->(d)
}
WITH r, s
OPTIONAL MATCH (s)-[:ON]->(d:Device)
RETURN collect(DISTINCT r.uid) AS completed, collect([d.device_id, s.uid]) AS touched
