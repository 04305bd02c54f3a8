// Devices by free memory: capacity, bytes of resident tensors, headroom and how many tenants use it.
MATCH (d:Device)
OPTIONAL MATCH (t:Tensor)-[:RESIDES_ON]->(d)
WITH d, sum(t.size_bytes) AS resident_bytes, count(DISTINCT t.tenant_id) AS tenants
RETURN d.device_id AS device, d.kind AS kind, d.mem_bytes AS mem_bytes, resident_bytes,
       d.mem_bytes - resident_bytes AS headroom_bytes,
       round(100.0 * resident_bytes / d.mem_bytes, 1) AS used_pct, tenants
ORDER BY headroom_bytes DESC, device
