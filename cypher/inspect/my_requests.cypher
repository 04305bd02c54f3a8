// A tenant's latest requests with their state and latency (tenant keys: scoped to the caller,
// and a key limited to projects to its projects).
// @param tenant_id: the tenant
// @param projects?: only requests of these projects (a list; a key limited to projects: forced to them), or null for all
MATCH (r:Request {tenant_id: $tenant_id})-[:FOR_MODEL]->(m:Model)
WHERE $projects IS NULL OR coalesce(r.project_id, 'default') IN $projects
RETURN r.uid AS request, m.model_id AS model, r.status AS status, size(r.prompt) AS prompt_tokens,
       r.max_tokens AS max_tokens, r.attempts AS attempts, r.ttft_s AS ttft_s, r.e2e_s AS e2e_s
ORDER BY r.arrival DESC
LIMIT 100
