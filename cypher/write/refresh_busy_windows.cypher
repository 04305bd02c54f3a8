// Bring the busy windows cached on devices up to date after a slice write, incrementally: the
// cache (Device.busy_start_s / busy_end_s, sorted by start, read by find_candidate_slots, with
// busy_uid naming each window's slice) keeps the windows of slices the write did not touch and
// takes the current window of each touched slice that is busy (planned or running: the busy
// states of service/domain/slice_state.py) and ON the device. The cost is the device's busy
// windows plus the slices touched there, whatever the device's history; refresh_device_state
// recomputes a cluster's caches from scratch. Run in the write's own transaction.
// @param devices: [{device_id, slice_uids: [slices the write touched there]}], sorted by device_id (one lock order)
UNWIND $devices AS row
MATCH (d:Device {device_id: row.device_id})
CALL (d, row) {
  // Take the device's write lock first, so concurrent writers update one after another.
  SET d.busy_version = coalesce(d.busy_version, 0) + 1
  WITH d, row, coalesce(d.busy_uid, []) AS uids
  WITH d, row, [i IN range(0, size(uids) - 1) WHERE NOT uids[i] IN row.slice_uids |
                [d.busy_start_s[i], d.busy_end_s[i], uids[i]]] AS kept
  CALL (d, row) {
    UNWIND row.slice_uids AS uid
    MATCH (s:Slice {uid: uid})-[:ON]->(d)
    WHERE s.state IN ['planned', 'running']
    RETURN collect([s.start_s, s.end_s, s.uid]) AS fresh
  }
  UNWIND CASE WHEN size(kept) + size(fresh) = 0 THEN [null] ELSE kept + fresh END AS w
  WITH d, w
  ORDER BY w[0], w[2]
  WITH d, collect(w) AS ws
  SET d.busy_start_s = [w IN ws | w[0]], d.busy_end_s = [w IN ws | w[1]], d.busy_uid = [w IN ws | w[2]]
}
RETURN count(d) AS devices
