// Rotate (a new key hash) or revoke (null) a tenant's API key; a revoked tenant keeps its models and requests.
// @param tenant_id: the tenant's id
// @param key_hash: SHA-256 hex of the new key, or null to revoke
MATCH (t:Tenant {tenant_id: $tenant_id})
SET t.key_hash = $key_hash,
    t.key_changed_at = datetime(),
    t.key_revoked_at = CASE WHEN $key_hash IS NULL THEN datetime() END
RETURN t.tenant_id AS tenant_id
