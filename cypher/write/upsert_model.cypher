// Create or update a tenant's model and its OWNS edge; the tenant must exist.
// @param tenant_id: owner
// @param uid: "<tenant_id>/<model_id>"
// @param props: map of model properties (model_id, name, style, num_params, dtype, ...)
MATCH (t:Tenant {tenant_id: $tenant_id})
MERGE (m:Model {uid: $uid})
ON CREATE SET m.created_at = datetime()
SET m += $props, m.tenant_id = $tenant_id
MERGE (t)-[:OWNS]->(m)
RETURN m.uid AS uid
