// Retention: delete the audit chain's archived prefix, the entries after $after_seq up to and
// including $through_seq, and record in the same transaction where the kept chain starts: the
// AuditArchive node's through_seq and through_hash (the last archived entry's), from which
// verification starts. Nothing happens (no row) unless the archive still stands at $after_seq
// (another run moved it meanwhile).
// @param log: the log's name ("audit")
// @param after_seq: the archive's through_seq before this batch (0: none archived yet)
// @param through_seq: the last entry of this batch
// @param through_hash: its hash
// @param genesis: the chain's genesis hash (an archive's start before any batch)
// @param archived_at: epoch seconds
// @param file: the archive file holding the batch
MERGE (a:AuditArchive {log: $log})
ON CREATE SET a.through_seq = 0, a.through_hash = $genesis, a.files = []
WITH a
WHERE a.through_seq = $after_seq
CALL (a) {
  MATCH (e:AuditEntry)
  WHERE e.seq > $after_seq AND e.seq <= $through_seq
  DETACH DELETE e
  RETURN count(*) AS deleted
}
SET a.through_seq = $through_seq, a.through_hash = $through_hash, a.archived_at = $archived_at,
    a.files = a.files + [$file]
RETURN deleted
