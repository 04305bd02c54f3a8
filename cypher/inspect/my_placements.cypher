// Where a tenant's work ran: slices (leases) per device and state (tenant keys: scoped to the
// caller, and a key limited to projects to the slices that serve its projects' requests).
// @param tenant_id: the tenant
// @param projects?: only slices serving requests of these projects (a list; a key limited to projects: forced to them), or null for all
MATCH (s:Slice {tenant_id: $tenant_id})-[:ON]->(d:Device)
WHERE $projects IS NULL
   OR EXISTS { (s)-[:SERVES]->(r:Request) WHERE coalesce(r.project_id, 'default') IN $projects }
RETURN d.device_id AS device, s.model_uid AS model, s.state AS state, count(s) AS slices
ORDER BY device, model, state
