// A page of the audit chain in seq order, for verification, read through the seq index and sent
// as one list (one record per page decodes much faster than one per entry). Each entry is a
// list of its fields: seq, at, actor, actor_role, action, target_kind, target_id, tenant_id,
// before, after, details, prev_hash, hash.
// @param after_seq: entries with a larger seq
// @param limit: entries per page
MATCH (e:AuditEntry)
WHERE e.seq > $after_seq
WITH e
ORDER BY e.seq
LIMIT $limit
RETURN collect([e.seq, e.at, e.actor, e.actor_role, e.action, e.target_kind, e.target_id, e.tenant_id,
                e.before, e.after, e.details, e.prev_hash, e.hash]) AS page
