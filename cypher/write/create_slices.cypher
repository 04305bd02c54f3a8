// Granted leases of the live service as Slices: each SERVES its request and runs ON the
// replica's devices (batched; a row whose request is unknown is skipped). A lease is 'running'
// while its executor holds it, its window [start_s, end_s) in epoch seconds: its grant to its
// expected end (service/domain/slice_state.py). Idempotent: a Slice already written (by its
// completion, which creates it when the writer has not yet) keeps its state; a lease that ended
// before its first write arrives whole, with its end and observation. Returns how many were
// created and the [device_id, slice uid] pairs (the caller refreshes those busy windows in the
// same transaction: refresh_busy_windows).
// @param rows: [{uid, tenant_id, model_uid, request_uid, device_ids, executor_id, state, start_s, end_s, start_wall, end_wall, busy_s?, iterations?, peak_bytes?}]
UNWIND $rows AS row
MATCH (r:Request {uid: row.request_uid})
MERGE (s:Slice {uid: row.uid})
ON CREATE SET s.tenant_id = row.tenant_id, s.model_uid = row.model_uid, s.executor_id = row.executor_id,
              s.state = row.state, s.start_s = row.start_s, s.end_s = row.end_s, s.start_wall = row.start_wall,
              s.end_wall = row.end_wall, s.live = true, s.busy_s = row.busy_s, s.iterations = row.iterations,
              s.peak_bytes = row.peak_bytes, s.fresh = true
WITH s, row, r
WHERE s.fresh
REMOVE s.fresh
CREATE (s)-[:SERVES]->(r)
WITH s, row
CALL (s, row) {
  UNWIND row.device_ids AS device_id
  MATCH (d:Device {device_id: device_id})
  CREATE (s)-[:ON]->(d)
  RETURN collect([device_id, s.uid]) AS devices
}
RETURN count(s) AS created, reduce(acc = [], ds IN collect(devices) | acc + ds) AS touched
