// Create or update an access request (onboarding, quota, model, SLA class) with its whole history.
// A request of an existing tenant hangs off it (REQUESTED); onboarding requests have no tenant yet.
// @param uid: the request's id
// @param props: map of properties (kind, tenant_id, project_id, status, payload_json, history_json, claim_hash, claimed, created_at, decided_at)
MERGE (a:AccessRequest {uid: $uid})
SET a += $props
WITH a
OPTIONAL MATCH (t:Tenant {tenant_id: a.tenant_id}) WHERE a.kind <> 'onboarding' OR a.status = 'approved'
FOREACH (_ IN CASE WHEN t IS NULL THEN [] ELSE [1] END | MERGE (t)-[:REQUESTED]->(a))
RETURN a.uid AS uid
