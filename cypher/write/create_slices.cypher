// Granted leases of the live service as Slices: each SERVES its request and runs ON the
// replica's devices (batched; a row whose request is unknown is skipped).
// A lease that ended before its first write arrives whole: with its end and observation.
// @param rows: [{uid, tenant_id, model_uid, request_uid, device_ids, executor_id, state, start_wall, end_wall, busy_s?, iterations?, peak_bytes?}]
UNWIND $rows AS row
MATCH (r:Request {uid: row.request_uid})
CREATE (s:Slice {uid: row.uid, tenant_id: row.tenant_id, model_uid: row.model_uid, executor_id: row.executor_id,
                 state: row.state, start_wall: row.start_wall, end_wall: row.end_wall, live: true,
                 busy_s: row.busy_s, iterations: row.iterations, peak_bytes: row.peak_bytes})
CREATE (s)-[:SERVES]->(r)
WITH s, row
CALL (s, row) {
  UNWIND row.device_ids AS device_id
  MATCH (d:Device {device_id: device_id})
  CREATE (s)-[:ON]->(d)
}
RETURN count(s) AS created
