// Create or update a tenant's project with its quota (HAS_PROJECT from its tenant).
// @param uid: "<tenant_id>/<project_id>"
// @param tenant_id: the owning tenant
// @param props: map of project properties (project_id, description, created_at, quota_tokens_per_s, quota_device_s_per_hour, quota_mem_bytes)
MATCH (t:Tenant {tenant_id: $tenant_id})
MERGE (p:Project {uid: $uid})
SET p += $props, p.tenant_id = $tenant_id
MERGE (t)-[:HAS_PROJECT]->(p)
RETURN p.uid AS uid
