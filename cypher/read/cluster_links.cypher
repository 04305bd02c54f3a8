// The device links of a cluster, one row per directed link (what apply_cluster diffs against).
// @param cluster: cluster name
MATCH (a:Device {cluster: $cluster})-[l:LINK]->(b:Device)
RETURN a.device_id AS src, b.device_id AS dst, l.kind AS kind, l.gbps AS gbps, l.latency_us AS latency_us
