// Append chained audit entries (one writer, in seq order) and link each to what it concerns
// where that node exists: its tenant, and the tenants, models and executor pools it names.
// The uniqueness of seq refuses an entry whose seq another writer took (no fork).
// @param rows: [{entry: {seq, at, actor, actor_role, action, target_kind, target_id, tenant_id, before, after, details, prev_hash, hash}, tenants: [tenant_id], models: [model uid], pools: [pool_id]}]
UNWIND $rows AS row
CREATE (e:AuditEntry)
SET e = row.entry
WITH e, row
CALL {
  WITH e, row
  UNWIND row.tenants AS tenant_id
  MATCH (t:Tenant {tenant_id: tenant_id})
  CREATE (e)-[:CONCERNS]->(t)
}
CALL {
  WITH e, row
  UNWIND row.models AS uid
  MATCH (m:Model {uid: uid})
  CREATE (e)-[:CONCERNS]->(m)
}
CALL {
  WITH e, row
  UNWIND row.pools AS pool_id
  MATCH (p:ExecutorPool {pool_id: pool_id})
  CREATE (e)-[:CONCERNS]->(p)
}
RETURN count(e) AS appended
