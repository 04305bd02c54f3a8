// The audit log, oldest first, with filters (null: any): who did what to what, when, before and
// after (JSON text). A tenant key sees its own tenant's entries only (tenant_id is forced).
// @param tenant_id: entries of this tenant (null: every tenant and the platform's; admin keys)
// @param action: an action, or a prefix of dotted parts ("tenant" matches tenant.create and tenant.key.rotate)
// @param actor: who acted (admin, a tenant id, an executor id, scheduler, service)
// @param target_id: the object acted on (a tenant id, a model uid tenant/model, a pool or executor id)
// @param since_seq: the first seq shown (inclusive; null: from the start)
// @param until_seq: the last seq shown (inclusive)
// @param since_at: from this time on (epoch seconds, inclusive)
// @param until_at: before this time (epoch seconds, exclusive)
// @param limit: entries at most
MATCH (e:AuditEntry)
WHERE e.seq >= coalesce($since_seq, 0) AND e.seq <= coalesce($until_seq, 9223372036854775807)
  AND ($tenant_id IS NULL OR e.tenant_id = $tenant_id)
  AND ($action IS NULL OR e.action = $action OR e.action STARTS WITH $action + '.')
  AND ($actor IS NULL OR e.actor = $actor)
  AND ($target_id IS NULL OR e.target_id = $target_id)
  AND ($since_at IS NULL OR e.at >= $since_at)
  AND ($until_at IS NULL OR e.at < $until_at)
RETURN e.seq AS seq, e.at AS at, e.actor AS actor, e.actor_role AS actor_role, e.action AS action,
       e.target_kind AS target_kind, e.target_id AS target_id, e.tenant_id AS tenant_id,
       e.before AS before, e.after AS after, e.details AS details, e.prev_hash AS prev_hash, e.hash AS hash
ORDER BY seq
LIMIT $limit
