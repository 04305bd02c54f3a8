// Create or update a tenant.
// @param tenant_id: the tenant's id
// @param props: map of tenant properties (name, sla_class, weight, priority)
MERGE (t:Tenant {tenant_id: $tenant_id})
ON CREATE SET t.created_at = datetime()
SET t += $props
