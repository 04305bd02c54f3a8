// The audit log, oldest first, with filters: who did what to what, when, before and after (JSON
// text). A tenant key sees its own tenant's entries only (tenant_id is forced).
// @param tenant_id: entries of this tenant (null: every tenant and the platform's; admin keys)
// @param filters: a map, each key absent or null for any: action (an action, or a prefix of dotted parts: "tenant" matches tenant.create and tenant.key.rotate), actor (admin, a tenant id, an executor id, scheduler, service), target_id (a tenant id, a model uid tenant/model, a pool or executor id), since_seq and until_seq (inclusive), since_at (epoch seconds, inclusive) and until_at (exclusive)
// @param limit: entries at most
WITH coalesce($filters, {}) AS f
MATCH (e:AuditEntry)
WHERE e.seq >= coalesce(f.since_seq, 0) AND e.seq <= coalesce(f.until_seq, 9223372036854775807)
  AND ($tenant_id IS NULL OR e.tenant_id = $tenant_id)
  AND (f.action IS NULL OR e.action = f.action OR e.action STARTS WITH f.action + '.')
  AND (f.actor IS NULL OR e.actor = f.actor)
  AND (f.target_id IS NULL OR e.target_id = f.target_id)
  AND (f.since_at IS NULL OR e.at >= f.since_at)
  AND (f.until_at IS NULL OR e.at < f.until_at)
RETURN e.seq AS seq, e.at AS at, e.actor AS actor, e.actor_role AS actor_role, e.action AS action,
       e.target_kind AS target_kind, e.target_id AS target_id, e.tenant_id AS tenant_id,
       e.before AS before, e.after AS after, e.details AS details, e.prev_hash AS prev_hash, e.hash AS hash
ORDER BY seq
LIMIT $limit
