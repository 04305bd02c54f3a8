// Slices with a measured latency (record_slice_observations) observed at or after $since (epoch
// seconds), oldest first, with the kind of the device they ran on: the cost model's training
// rows from live observations (`slicesched cost-model train --from-gmg`). The kind is the one
// kept on the Slice when it was observed (its Device node may be gone: an executor that left),
// else, for rows written before the Slice kept it, its device's.
// @param since: epoch seconds
MATCH (s:Slice)
WHERE s.latency_s IS NOT NULL AND s.observed_wall >= $since
OPTIONAL MATCH (d:Device {device_id: s.observed_device_id})
WITH s, coalesce(s.observed_device_kind, d.kind) AS device_kind
WHERE device_kind IS NOT NULL
RETURN s.uid AS uid, s.family AS family, device_kind, s.layer_start AS layer_start,
       s.layer_end AS layer_end, s.batch AS batch, s.tokens AS tokens, coalesce(s.context, 0) AS context,
       s.phase AS phase, s.latency_s AS latency_s,
       s.observed_wall AS observed_wall
ORDER BY s.observed_wall, s.uid
