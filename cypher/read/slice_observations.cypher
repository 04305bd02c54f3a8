// Slices with a measured latency (record_slice_observations) observed at or after $since (epoch
// seconds), oldest first, with the kind of the device they ran on: the cost model's training
// rows from live observations (`slicesched cost-model train --from-gmg`).
// @param since: epoch seconds
MATCH (s:Slice)
WHERE s.latency_s IS NOT NULL AND s.observed_wall >= $since
MATCH (d:Device {device_id: s.observed_device_id})
RETURN s.uid AS uid, s.family AS family, d.kind AS device_kind, s.layer_start AS layer_start,
       s.layer_end AS layer_end, s.batch AS batch, s.tokens AS tokens, coalesce(s.context, 0) AS context,
       s.phase AS phase, s.latency_s AS latency_s,
       s.observed_wall AS observed_wall
ORDER BY s.observed_wall, s.uid
