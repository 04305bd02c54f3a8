// Accept requests: create each with its prompt (so a restart can run it) FOR_MODEL its model.
// Written before the API answers 202: an accepted request is never lost. A row whose
// idempotency key its tenant has used before creates nothing: the earlier request comes back
// in `existing`. Returns how many rows named a known model (the caller checks it equals its
// row count) and the earlier requests.
// @param rows: [{uid, tenant_id, model_uid, model_id, prompt, max_tokens, sla_class, token_budget, arrival, status, attempts, idempotency_key?, body_sha?, ...}]
UNWIND $rows AS row
MATCH (m:Model {uid: row.model_uid})
OPTIONAL MATCH (old:Request {tenant_id: row.tenant_id, idempotency_key: row.idempotency_key})
CALL (row, m, old) {
  WITH row, m, old
  WHERE old IS NULL
  CREATE (r:Request {uid: row.uid})
  SET r += row
  CREATE (r)-[:FOR_MODEL]->(m)
}
RETURN count(row) AS matched,
       collect(CASE WHEN old IS NOT NULL THEN old {.uid, .idempotency_key, .body_sha, .status, .token_budget,
                                                   prompt_tokens: size(old.prompt)} END) AS existing
