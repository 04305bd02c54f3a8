// Candidate slots for a slice (contract: service/core/slot.py): per device of $cluster whose kind
// has a duration, the earliest start >= max($now_s, inputs ready) that overlaps no live slice and
// keeps memory under mem_bytes * (1 - $margin); the best $k by (start_s, -headroom, device_id).
// Inputs ready: from each producer, expand to the devices it reaches (itself: 0 s; a device LINK;
// else the host LINK to other hosts) instead of testing every device against every producer.
// Free start: one sweep, in start order, over the device's live windows cached on the device
// (busy_start_s / busy_end_s, kept by the slice writes): a window that overlaps the candidate
// moves it to that window's end. Reading them from Slice nodes instead costs an expand, a sort
// and an aggregation per device (about 4x slower at 1,000 devices).
// Memory: cached Device.resident_bytes (write/refresh_device_state); a free window overlaps no
// slice, so live slices add nothing to it.
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
CALL () {
  OPTIONAL MATCH (w:Tensor {model_uid: $model_uid, kind: 'weight'})-[:RESIDES_ON]->(r:Device)
  WHERE $needs_weights
  RETURN collect(DISTINCT r) AS resident_on
}
CALL () {
  UNWIND CASE WHEN size($input_deps) = 0 THEN [1] ELSE [] END AS none
  MATCH (d:Device {cluster: $cluster})
  RETURN d, $now_s AS ready_s
  UNION ALL
  UNWIND range(0, size($input_deps) - 1) AS i
  WITH i, $input_deps[i] AS dep
  MATCH (p:Device {device_id: dep.device_id})
  CALL (p, dep) {
    RETURN p AS x, 0.0 AS transfer_s, 0 AS rank
    UNION ALL
    MATCH (p)-[l:LINK]->(x:Device)
    WHERE x <> p
    RETURN x, dep.bytes / (l.gbps * 1e9 / 8) + l.latency_us * 1e-6 AS transfer_s, 1 AS rank
    UNION ALL
    MATCH (ph:Host)-[:HAS_DEVICE]->(p)
    MATCH (ph)-[hl:LINK]->(xh:Host)-[:HAS_DEVICE]->(x:Device)
    WHERE xh <> ph
    RETURN x, dep.bytes / (hl.gbps * 1e9 / 8) + hl.latency_us * 1e-6 AS transfer_s, 2 AS rank
  }
  WITH i, dep, x, rank, min(transfer_s) AS transfer_s
  WITH i, dep, x, reduce(best = [9, 0.0], c IN collect([rank, transfer_s]) |
                         CASE WHEN c[0] < best[0] THEN c ELSE best END)[1] AS transfer_s
  WITH x AS d, max(dep.end_s + transfer_s) AS ready_s, count(i) AS reached
  WHERE reached = size($input_deps) AND d.cluster = $cluster
  RETURN d, ready_s
}
WITH d, ready_s, resident_on, $duration_s_by_kind[d.kind] AS duration_s
WHERE duration_s IS NOT NULL
WITH d, duration_s, CASE WHEN ready_s > $now_s THEN ready_s ELSE $now_s END AS t0,
     d.mem_bytes * (1.0 - $margin) - (coalesce(d.resident_bytes, 0) + $slice_bytes +
       CASE WHEN $needs_weights AND NOT d IN resident_on THEN $weight_bytes ELSE 0 END) AS headroom_bytes
WHERE headroom_bytes >= 0
WITH d, headroom_bytes, t0, duration_s, coalesce(d.busy_start_s, []) AS busy_start, coalesce(d.busy_end_s, []) AS busy_end
WITH d, headroom_bytes, reduce(c = t0, i IN range(0, size(busy_start) - 1) |
  CASE WHEN c < busy_end[i] AND busy_start[i] < c + duration_s THEN busy_end[i] ELSE c END) AS start_s
RETURN d.device_id AS device_id, start_s, headroom_bytes
ORDER BY start_s, headroom_bytes DESC, device_id
LIMIT $k
