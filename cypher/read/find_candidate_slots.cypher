// Candidate slots for a slice (contract: service/core/slot.py): per device of $cluster whose kind
// has a duration, the earliest start >= max($now_s, inputs ready) that overlaps no live slice and
// keeps memory under mem_bytes * (1 - $margin); the best $k by (start_s, -headroom, device_id).
// Inputs ready: from each producer, expand to the devices it reaches (itself: 0 s; a device LINK;
// else the host LINK to the other hosts' devices, the transfer computed once per host) instead of
// testing every device against every producer.
// Memory: cached Device.resident_bytes (write/refresh_device_state); a free window overlaps no
// slice, so live slices add nothing to it.
// Free start: one sweep, in start order, over the device's live windows cached on the device
// (busy_start_s / busy_end_s, kept by the slice writes): a window that overlaps the candidate
// moves it to that window's end. Reading those two lists is most of a device's cost (reading them
// from Slice nodes instead costs an expand, a sort and an aggregation per device, about 4x more),
// so the sweep runs only where it can matter: a device's start is never before its t0 =
// max($now_s, ready), so devices are ranked by the lower bound (t0, -headroom, device_id) and swept
// in tiers (the first $scan_first, then the next 3 * $scan_first, then the rest); a tier runs only
// while the k-th best exact key found so far is not below the lower bound of the next unswept
// device. Exact, same answers as sweeping every device; on 1,000 busy devices the first tier
// decides about 97% of queries.
// @param cluster: the devices searched (Device.cluster)
// @param now_s: earliest start, seconds
// @param duration_s_by_kind: {device kind: the slice's duration there, s}; other kinds are skipped
// @param slice_bytes: bytes the slice holds while it runs
// @param weight_bytes: the model's weight bytes, added where needed and not resident
// @param needs_weights: whether the slice needs the model's weights on its device
// @param model_uid: the model whose weights may already be resident
// @param input_deps: [{device_id, end_s, bytes}] producers of the slice's inputs
// @param margin: fraction of device memory kept free
// @param k: how many slots
// @param scan_first: devices swept in the first tier (>= 1; a tuning knob, the answer does not depend on it)
CALL () {
  UNWIND CASE WHEN $needs_weights THEN [1] ELSE [] END AS needed
  MATCH (w:Tensor {model_uid: $model_uid, kind: 'weight'})-[:RESIDES_ON]->(r:Device)
  RETURN collect(DISTINCT r) AS resident_on
}
CALL () {
  UNWIND CASE WHEN size($input_deps) = 0 THEN [1] ELSE [] END AS none
  MATCH (d:Device {cluster: $cluster})
  RETURN d, $now_s AS ready_s
  UNION ALL
  UNWIND $input_deps AS dep
  MATCH (p:Device {device_id: dep.device_id})
  CALL (p, dep) {
    RETURN p AS x, dep.end_s AS arrive_s
    UNION ALL
    MATCH (p)-[l:LINK]->(x:Device)
    WHERE x <> p
    WITH x, min(dep.bytes / (l.gbps * 1e9 / 8) + l.latency_us * 1e-6) AS transfer_s
    RETURN x, dep.end_s + transfer_s AS arrive_s
    UNION ALL
    // other hosts' devices without a device link from p: the host link
    MATCH (ph:Host)-[:HAS_DEVICE]->(p)
    OPTIONAL MATCH (p)-[:LINK]->(n:Device)
    WITH ph, collect(n) AS direct
    MATCH (ph)-[hl:LINK]->(xh:Host)
    WHERE xh <> ph
    WITH direct, xh, min(dep.bytes / (hl.gbps * 1e9 / 8) + hl.latency_us * 1e-6) AS transfer_s
    MATCH (xh)-[:HAS_DEVICE]->(x:Device)
    WHERE NOT x IN direct
    RETURN x, dep.end_s + transfer_s AS arrive_s
  }
  // one row per (input, reached device): a device is a candidate when every input reaches it
  WITH x AS d, max(arrive_s) AS ready_s, count(*) AS reached
  WHERE reached = size($input_deps) AND d.cluster = $cluster
  RETURN d, ready_s
}
WITH d, ready_s, resident_on, $duration_s_by_kind[d.kind] AS duration_s
WHERE duration_s IS NOT NULL
WITH d, duration_s, CASE WHEN ready_s > $now_s THEN ready_s ELSE $now_s END AS t0,
     d.mem_bytes * (1.0 - $margin) - (coalesce(d.resident_bytes, 0) + $slice_bytes +
       CASE WHEN $needs_weights AND NOT d IN resident_on THEN $weight_bytes ELSE 0 END) AS headroom_bytes
WHERE headroom_bytes >= 0
WITH d, duration_s, t0, headroom_bytes, d.device_id AS device_id
ORDER BY t0, headroom_bytes DESC, device_id
// candidates in lower-bound order: [device, duration, t0, headroom, device_id]
WITH collect([d, duration_s, t0, headroom_bytes, device_id]) AS cands, $scan_first AS first
CALL (cands, first) {
  UNWIND cands[0..first] AS c
  WITH c, c[0] AS d, c[1] AS duration_s
  WITH c, coalesce(d.busy_start_s, []) AS busy_start, coalesce(d.busy_end_s, []) AS busy_end, duration_s
  WITH c, reduce(t = c[2], i IN range(0, size(busy_start) - 1) |
    CASE WHEN t < busy_end[i] AND busy_start[i] < t + duration_s THEN busy_end[i] ELSE t END) AS start_s
  ORDER BY start_s, c[3] DESC, c[4]
  LIMIT $k
  RETURN collect([start_s, c[3], c[4]]) AS best1
}
// exact when nothing is left, or k slots are found and the k-th is below the next lower bound
WITH cands, first, best1, last(best1) AS kth, cands[first] AS next
WITH cands, first, best1,
     next IS NULL OR (size(best1) = $k AND (kth[0] < next[2] OR (kth[0] = next[2] AND
       (kth[1] > next[3] OR (kth[1] = next[3] AND kth[2] < next[4]))))) AS exact1
CALL (cands, first, exact1) {
  UNWIND CASE WHEN exact1 THEN [] ELSE cands[first..4 * first] END AS c
  WITH c, c[0] AS d, c[1] AS duration_s
  WITH c, coalesce(d.busy_start_s, []) AS busy_start, coalesce(d.busy_end_s, []) AS busy_end, duration_s
  WITH c, reduce(t = c[2], i IN range(0, size(busy_start) - 1) |
    CASE WHEN t < busy_end[i] AND busy_start[i] < t + duration_s THEN busy_end[i] ELSE t END) AS start_s
  ORDER BY start_s, c[3] DESC, c[4]
  LIMIT $k
  RETURN collect([start_s, c[3], c[4]]) AS more
}
CALL (best1, more) {
  UNWIND best1 + more AS r
  WITH r
  ORDER BY r[0], r[1] DESC, r[2]
  LIMIT $k
  RETURN collect(r) AS best2
}
WITH cands, first, exact1, best2, last(best2) AS kth, cands[4 * first] AS next
WITH cands, first, best2,
     exact1 OR next IS NULL OR (size(best2) = $k AND (kth[0] < next[2] OR (kth[0] = next[2] AND
       (kth[1] > next[3] OR (kth[1] = next[3] AND kth[2] < next[4]))))) AS exact2
CALL (cands, first, exact2) {
  UNWIND CASE WHEN exact2 THEN [] ELSE cands[4 * first..] END AS c
  WITH c, c[0] AS d, c[1] AS duration_s
  WITH c, coalesce(d.busy_start_s, []) AS busy_start, coalesce(d.busy_end_s, []) AS busy_end, duration_s
  WITH c, reduce(t = c[2], i IN range(0, size(busy_start) - 1) |
    CASE WHEN t < busy_end[i] AND busy_start[i] < t + duration_s THEN busy_end[i] ELSE t END) AS start_s
  ORDER BY start_s, c[3] DESC, c[4]
  LIMIT $k
  RETURN collect([start_s, c[3], c[4]]) AS rest
}
UNWIND best2 + rest AS r
WITH r[0] AS start_s, r[1] AS headroom_bytes, r[2] AS device_id
RETURN device_id, start_s, headroom_bytes
ORDER BY start_s, headroom_bytes DESC, device_id
LIMIT $k
