// Every project with its quota (restart recovery).
MATCH (p:Project)
RETURN p.tenant_id AS tenant_id, p.project_id AS project_id, p.description AS description,
       p.created_at AS created_at, p.quota_tokens_per_s AS quota_tokens_per_s,
       p.quota_device_s_per_hour AS quota_device_s_per_hour, p.quota_mem_bytes AS quota_mem_bytes
ORDER BY tenant_id, project_id
