// Tenants of the live service with their key hashes (restart recovery); a revoked key is a null hash.
MATCH (t:Tenant)
WHERE t.key_hash IS NOT NULL OR t.key_revoked_at IS NOT NULL
RETURN t.tenant_id AS tenant_id, t.sla_class AS sla_class, t.weight AS weight, t.priority AS priority,
       t.key_hash AS key_hash
ORDER BY tenant_id
