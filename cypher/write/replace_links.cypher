// Replace the links between a cluster's devices with the given directed links.
// @param cluster: cluster name
// @param rows: [{src, dst, kind, gbps, latency_us}]
OPTIONAL MATCH (:Device {cluster: $cluster})-[old:LINK]->(:Device)
DELETE old
WITH count(*) AS ignored
UNWIND $rows AS row
MATCH (a:Device {device_id: row.src})
MATCH (b:Device {device_id: row.dst})
CREATE (a)-[:LINK {kind: row.kind, gbps: row.gbps, latency_us: row.latency_us}]->(b)
