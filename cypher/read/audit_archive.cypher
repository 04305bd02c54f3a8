// Where the audit chain kept in the graph starts: the archived prefix's last seq and hash (both
// null when nothing was archived), and the archive files that hold the prefix.
// @param log: the log's name ("audit")
OPTIONAL MATCH (a:AuditArchive {log: $log})
RETURN a.through_seq AS through_seq, a.through_hash AS through_hash, a.files AS files
