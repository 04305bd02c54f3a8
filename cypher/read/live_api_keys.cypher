// Every API key with its hash (null: revoked), role, projects and expiry (restart recovery).
MATCH (k:ApiKey)
RETURN k.key_id AS key_id, k.tenant_id AS tenant_id, k.name AS name, k.role AS role, k.projects AS projects,
       k.key_hash AS key_hash, k.expires_at AS expires_at, k.created_at AS created_at, k.created_by AS created_by
ORDER BY key_id
