// Where the audit chain stands: its stored head and its highest entry (both null when empty).
// @param log: the log's name ("audit")
OPTIONAL MATCH (h:AuditHead {log: $log})
CALL {
  OPTIONAL MATCH (e:AuditEntry)
  WHERE e.seq IS NOT NULL
  RETURN e ORDER BY e.seq DESC LIMIT 1
}
RETURN h.seq AS head_seq, h.hash AS head_hash, e.seq AS last_seq, e.hash AS last_hash
