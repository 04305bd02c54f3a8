// Tenants of the live service with their key hashes (restart recovery); a revoked key is a null
// hash, and an onboarded tenant whose key is not yet claimed has none either. Quotas: null is none.
MATCH (t:Tenant)
WHERE t.key_hash IS NOT NULL OR t.key_revoked_at IS NOT NULL OR t.approved_at IS NOT NULL
RETURN t.tenant_id AS tenant_id, t.sla_class AS sla_class, t.weight AS weight, t.priority AS priority,
       t.key_hash AS key_hash, t.quota_tokens_per_s AS quota_tokens_per_s,
       t.quota_device_s_per_hour AS quota_device_s_per_hour, t.quota_mem_bytes AS quota_mem_bytes
ORDER BY tenant_id
