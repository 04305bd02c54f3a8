// Delete everything a tenant owns, in chunks of $limit nodes; run until it returns 0.
// @param tenant_id: the tenant
// @param limit: nodes per chunk
MATCH (n {tenant_id: $tenant_id})
WITH n LIMIT $limit
DETACH DELETE n
RETURN count(*) AS deleted
