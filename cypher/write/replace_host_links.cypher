// Replace the network links between a cluster's hosts: the per-host link model used between
// devices of different hosts that have no device LINK of their own (keeps a large cluster's
// edges at hosts^2 rather than devices^2).
// @param cluster: cluster name
// @param rows: [{src, dst, kind, gbps, latency_us}] directed, by host_id
OPTIONAL MATCH (:Host {cluster: $cluster})-[old:LINK]->(:Host)
DELETE old
WITH count(*) AS ignored
UNWIND $rows AS row
MATCH (a:Host {host_id: row.src})
MATCH (b:Host {host_id: row.dst})
CREATE (a)-[:LINK {kind: row.kind, gbps: row.gbps, latency_us: row.latency_us}]->(b)
RETURN count(*) AS links
