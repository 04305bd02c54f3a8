// The audit log's constraints. Idempotent (IF NOT EXISTS). One entry per seq: its index also
// serves every walk of the chain in seq order (verification, filtered reads from a seq on); one
// head per log. No other index: each would slow every append, and a filtered read walks the seq
// index from its since_seq on.
CREATE CONSTRAINT audit_entry_seq IF NOT EXISTS FOR (n:AuditEntry) REQUIRE n.seq IS UNIQUE;
CREATE CONSTRAINT audit_head_log IF NOT EXISTS FOR (n:AuditHead) REQUIRE n.log IS UNIQUE
