// Recompute the per-device state cached for find_candidate_slots on a cluster's devices:
// Device.resident_bytes (bytes of weight tensors RESIDES_ON it) and, from scratch, the busy
// windows of its planned and running slices (busy_start_s / busy_end_s sorted by start, busy_uid
// naming each window's slice; the slice writes keep them up to date incrementally:
// refresh_busy_windows). Run after weights move (place_weights, imports with a device) and after
// deletes that bypass the slice writes (delete_tenant).
// The busy slices are found through the (state, end_s) index, not by expanding each device's ON
// relationships: a device keeps every slice it ran until retention deletes it (thousands at the
// live service's steady state), of which a handful are busy, so the cost follows the busy slices,
// not the history (benchmarks/candidate_slots.py times it at steady-state size).
// @param cluster: cluster name
MATCH (d:Device {cluster: $cluster})
CALL (d) {
  OPTIONAL MATCH (t:Tensor {kind: 'weight'})-[:RESIDES_ON]->(d)
  RETURN coalesce(sum(t.size_bytes), 0) AS resident_bytes
}
// Take each device's write lock first, so concurrent writers recompute one after another.
SET d.resident_bytes = resident_bytes, d.busy_version = coalesce(d.busy_version, 0) + 1,
    d.busy_start_s = [], d.busy_end_s = [], d.busy_uid = []
WITH count(d) AS devices
CALL () {
  MATCH (s:Slice)
  WHERE s.state IN ['planned', 'running'] AND s.end_s IS NOT NULL
  MATCH (s)-[:ON]->(d:Device {cluster: $cluster})
  WITH d, s
  ORDER BY s.start_s, s.uid
  WITH d, collect(s.start_s) AS starts, collect(s.end_s) AS ends, collect(s.uid) AS uids
  SET d.busy_start_s = starts, d.busy_end_s = ends, d.busy_uid = uids
  RETURN count(d) AS busy_devices
}
RETURN devices
