// Requests as Neo4j holds them (status and result), by uid: the live service reconciles its
// memory with them after a commit whose answer was lost.
// @param uids: request uids
MATCH (r:Request)
WHERE r.uid IN $uids
RETURN r.uid AS uid, r.status AS status, r.output_tokens AS output_tokens, r.queued_s AS queued_s,
       r.ttft_s AS ttft_s, r.e2e_s AS e2e_s, r.finished_at AS finished_at, r.error AS error
