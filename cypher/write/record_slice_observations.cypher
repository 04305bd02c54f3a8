// What executors measured running slices, on their Slice nodes: the latency of one micro-batch
// through layers [layer_start, layer_end) of a model (the operators the slice covers), the batch
// features (sequences, tokens, the cached context a decode attends, phase), the device it ran on
// and when (epoch seconds). The Slice
// is created ON that device if the placement did not write it (a live guest slice placed by the
// executor's own queue, or a later stage of a lease whose first stage is the lease's own Slice),
// done, with its window in epoch seconds (the live Slices' retention deletes it in its turn).
// The device's kind is kept on the Slice: the row stays a training row after its executor has
// left and its Device node is gone. Batched. A row naming an unknown device writes nothing.
// @param rows: [{uid, tenant_id, family, device_id, layer_start, layer_end, batch, tokens, context, phase, latency_s, observed_wall}]
UNWIND $rows AS row
MATCH (d:Device {device_id: row.device_id})
MERGE (s:Slice {uid: row.uid})
ON CREATE SET s.tenant_id = row.tenant_id, s.state = 'done', s.start_s = row.observed_wall - row.latency_s,
              s.end_s = row.observed_wall, s.start_wall = row.observed_wall - row.latency_s,
              s.end_wall = row.observed_wall, s.live = true, s.fresh = true
SET s.family = row.family, s.layer_start = row.layer_start, s.layer_end = row.layer_end, s.batch = row.batch,
    s.tokens = row.tokens, s.context = coalesce(row.context, 0), s.phase = row.phase, s.latency_s = row.latency_s, s.observed_wall = row.observed_wall,
    s.observed_device_id = row.device_id, s.observed_device_kind = d.kind
WITH s, d
CALL (s, d) {
  WITH s, d
  WHERE s.fresh
  REMOVE s.fresh
  CREATE (s)-[:ON]->(d)
}
RETURN count(s) AS recorded
