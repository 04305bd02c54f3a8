// Create or update an API key (its SHA-256 only, never the key): role, projects, expiry; a null
// key_hash is a revoked key. A tenant's key hangs off its tenant (HAS_KEY); an auditor's off none.
// @param uid: "<tenant_id>/<key_id>" (an auditor's: "platform/<key_id>")
// @param props: map of key properties (key_id, tenant_id, name, role, projects, key_hash, expires_at, created_at, created_by)
MERGE (k:ApiKey {uid: $uid})
SET k += $props
WITH k
OPTIONAL MATCH (t:Tenant {tenant_id: k.tenant_id})
FOREACH (_ IN CASE WHEN t IS NULL THEN [] ELSE [1] END | MERGE (t)-[:HAS_KEY]->(k))
RETURN k.uid AS uid
