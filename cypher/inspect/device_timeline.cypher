// A device's timeline: its slices (planned, running or ended; live leases too) that end at or
// after $since_s, by start, with how many operators each covers. A tenant sees its own slices by
// name and other tenants' only as anonymous busy windows (start and end; no uid, tenant, model,
// state or operators), and nothing at all of a device it has no slice on. A key limited to
// projects sees by name only the slices that serve its projects' requests.
// @param device_id: the device (as devices_headroom names it)
// @param tenant_id: the viewer: a tenant (its key's own, forced by the API), or null for every tenant by name (admin)
// @param projects?: name only the viewer's slices serving requests of these projects (a list; a key limited to projects: forced to them), or null for all
// @param since_s: the earliest end shown, in the device's time base (the live cluster: epoch seconds; a planner's cluster: its seconds)
MATCH (d:Device {device_id: $device_id})
WHERE $tenant_id IS NULL OR EXISTS { (:Slice {tenant_id: $tenant_id})-[:ON]->(d) }
MATCH (s:Slice)-[:ON]->(d)
WHERE s.end_s >= $since_s OR s.end_s IS NULL
WITH s, ($tenant_id IS NULL OR s.tenant_id = $tenant_id)
        AND ($projects IS NULL
             OR EXISTS { (s)-[:SERVES]->(r:Request) WHERE coalesce(r.project_id, 'default') IN $projects }) AS named
RETURN CASE WHEN named THEN s.uid END AS slice, CASE WHEN named THEN s.tenant_id END AS tenant,
       CASE WHEN named THEN s.model_uid END AS model, CASE WHEN named THEN s.state END AS state,
       s.start_s AS start_s, s.end_s AS end_s,
       CASE WHEN named THEN COUNT { (s)-[:COVERS]->(:Operator) } END AS operators
ORDER BY start_s, end_s, slice
