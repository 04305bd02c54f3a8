// Delete everything a tenant owns, in chunks of $limit nodes; run until it returns 0. Its audit
// entries stay: the audit log is append-only (their CONCERNS links go with the tenant).
// @param tenant_id: the tenant
// @param limit: nodes per chunk
MATCH (n {tenant_id: $tenant_id})
WHERE NOT n:AuditEntry
WITH n LIMIT $limit
DETACH DELETE n
RETURN count(*) AS deleted
