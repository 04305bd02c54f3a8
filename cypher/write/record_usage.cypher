// Quota usage onto the GMG: a row with a null project_id is its tenant's, else its project's.
// @param rows: [{tenant_id, project_id, tokens_used, requests_refused, device_s_last_hour, device_s_total, at}]
UNWIND $rows AS row
OPTIONAL MATCH (t:Tenant {tenant_id: row.tenant_id}) WHERE row.project_id IS NULL
OPTIONAL MATCH (p:Project {uid: row.tenant_id + '/' + coalesce(row.project_id, '')})
WITH row, coalesce(t, p) AS n WHERE n IS NOT NULL
SET n.usage_tokens_used = row.tokens_used, n.usage_requests_refused = row.requests_refused,
    n.usage_device_s_last_hour = row.device_s_last_hour, n.usage_device_s_total = row.device_s_total,
    n.usage_at = row.at
RETURN count(n) AS written
