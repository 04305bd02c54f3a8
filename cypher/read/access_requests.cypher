// Every access request with its history (restart recovery).
MATCH (a:AccessRequest)
RETURN a.uid AS uid, a.kind AS kind, a.tenant_id AS tenant_id, a.project_id AS project_id, a.status AS status,
       a.payload_json AS payload_json, a.history_json AS history_json, a.claim_hash AS claim_hash,
       a.claimed AS claimed, a.created_at AS created_at, a.decided_at AS decided_at
ORDER BY created_at, uid
