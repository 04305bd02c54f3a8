// Accept requests: create each with its prompt (so a restart can run it) FOR_MODEL its model.
// Written before the API answers 202: an accepted request is never lost. Returns how many were
// created; the caller checks it equals its row count (a row naming an unknown model is skipped).
// @param rows: [{uid, tenant_id, model_uid, model_id, prompt, max_tokens, sla_class, token_budget, arrival, status, attempts, ...}]
UNWIND $rows AS row
MATCH (m:Model {uid: row.model_uid})
CREATE (r:Request {uid: row.uid})
SET r += row
CREATE (r)-[:FOR_MODEL]->(m)
RETURN count(r) AS created
