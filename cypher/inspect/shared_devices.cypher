// Which tenants share a device: devices holding tensors of more than one tenant.
MATCH (t:Tensor)-[:RESIDES_ON]->(d:Device)
WITH d, t.tenant_id AS tenant, sum(t.size_bytes) AS bytes
WITH d, collect(tenant) AS tenants, collect(bytes) AS bytes_per_tenant
WHERE size(tenants) > 1
RETURN d.device_id AS device, tenants, bytes_per_tenant
ORDER BY device
