// Create or update directed device links (only the ones that changed are passed).
// @param rows: [{src, dst, kind, gbps, latency_us}]
UNWIND $rows AS row
MATCH (a:Device {device_id: row.src})
MATCH (b:Device {device_id: row.dst})
MERGE (a)-[l:LINK]->(b)
SET l.kind = row.kind, l.gbps = row.gbps, l.latency_us = row.latency_us
RETURN count(*) AS links
