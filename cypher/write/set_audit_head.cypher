// The audit chain's head (its last entry's seq and hash), written in the same transaction as
// the entries it follows: removing the newest entries then shows in `audit verify`.
// @param log: the log's name ("audit")
// @param seq: the last entry's seq
// @param hash: the last entry's hash
MERGE (h:AuditHead {log: $log})
SET h.seq = $seq, h.hash = $hash
