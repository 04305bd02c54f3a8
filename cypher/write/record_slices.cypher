// Leases of the live service as Slices: each SERVES its request and runs ON the replica's
// devices; state follows the lease (leased, done, expired, failed, cancelled). Batched.
// @param rows: [{uid, tenant_id, model_uid, request_uid, device_ids, executor_id, state, start_wall, end_wall}]
UNWIND $rows AS row
MATCH (r:Request {uid: row.request_uid})
MERGE (s:Slice {uid: row.uid})
SET s.tenant_id = row.tenant_id, s.model_uid = row.model_uid, s.executor_id = row.executor_id,
    s.state = row.state, s.start_wall = row.start_wall, s.end_wall = row.end_wall, s.live = true
MERGE (s)-[:SERVES]->(r)
WITH s, row
UNWIND row.device_ids AS device_id
MATCH (d:Device {device_id: device_id})
MERGE (s)-[:ON]->(d)
RETURN count(DISTINCT s) AS recorded
