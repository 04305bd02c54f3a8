// Where a tenant's work ran: slices (leases) per device and state (tenant keys: scoped to the caller).
// @param tenant_id: the tenant
MATCH (s:Slice {tenant_id: $tenant_id})-[:ON]->(d:Device)
RETURN d.device_id AS device, s.model_uid AS model, s.state AS state, count(s) AS slices
ORDER BY device, model, state
