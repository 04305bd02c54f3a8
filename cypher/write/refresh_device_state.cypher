// Recompute the per-device state cached for find_candidate_slots on a cluster's devices:
// Device.resident_bytes (bytes of weight tensors RESIDES_ON it) and the busy windows of its live
// slices. Run after weights move (place_weights, imports with a device) and after deletes that
// bypass the slice writes (delete_tenant).
// @param cluster: cluster name
MATCH (d:Device {cluster: $cluster})
CALL (d) {
  OPTIONAL MATCH (t:Tensor {kind: 'weight'})-[:RESIDES_ON]->(d)
  RETURN coalesce(sum(t.size_bytes), 0) AS resident_bytes
}
SET d.resident_bytes = resident_bytes
WITH d
CALL (d) {
  // Take the device's write lock first, so concurrent writers recompute one after another.
  SET d.busy_version = coalesce(d.busy_version, 0) + 1
  WITH d
  OPTIONAL MATCH (s:Slice)-[:ON]->(d)
  WHERE s.state IN ['placed', 'running']
  WITH d, s
  ORDER BY s.start_s
  WITH d, collect(s.start_s) AS starts, collect(s.end_s) AS ends
  SET d.busy_start_s = starts, d.busy_end_s = ends
}
RETURN count(d) AS devices
