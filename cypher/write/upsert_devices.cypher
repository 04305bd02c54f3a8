// Create or update devices and attach each to its host.
// @param cluster: cluster name
// @param rows: [{device_id, host_id, kind, mem_bytes, peak_flops, mem_bw_bytes_per_s}]
UNWIND $rows AS row
MATCH (h:Host {host_id: row.host_id})
MERGE (d:Device {device_id: row.device_id})
SET d += row, d.cluster = $cluster
MERGE (h)-[:HAS_DEVICE]->(d)
