// Create or update hosts.
// @param cluster: cluster name
// @param rows: [{host_id}]
UNWIND $rows AS row
MERGE (h:Host {host_id: row.host_id})
SET h.cluster = $cluster
