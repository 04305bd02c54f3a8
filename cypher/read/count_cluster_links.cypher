// How many device links leave a cluster's devices (a degree lookup per device, no link is read).
// @param cluster: cluster name
MATCH (d:Device {cluster: $cluster})
RETURN sum(COUNT { (d)-[:LINK]->() }) AS links
