// Remove a cluster's devices and hosts that its current spec no longer lists.
// @param cluster: cluster name
// @param device_ids: ids to keep
// @param host_ids: ids to keep
OPTIONAL MATCH (d:Device {cluster: $cluster}) WHERE NOT d.device_id IN $device_ids
DETACH DELETE d
WITH count(*) AS ignored
OPTIONAL MATCH (h:Host {cluster: $cluster}) WHERE NOT h.host_id IN $host_ids
DETACH DELETE h
