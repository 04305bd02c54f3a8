// Links between devices with bandwidth and latency, one row per undirected pair.
MATCH (a:Device)-[l:LINK]->(b:Device)
WHERE a.device_id < b.device_id
RETURN a.device_id AS src, b.device_id AS dst, l.kind AS kind, l.gbps AS gbps, l.latency_us AS latency_us
ORDER BY src, dst
