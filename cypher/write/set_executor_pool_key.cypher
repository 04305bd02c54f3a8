// Rotate (a new key hash) or revoke (null) an executor pool's key.
// @param pool_id: the pool's id
// @param key_hash: SHA-256 hex of the new key, or null to revoke
MATCH (p:ExecutorPool {pool_id: $pool_id})
SET p.key_hash = $key_hash,
    p.key_changed_at = datetime(),
    p.key_revoked_at = CASE WHEN $key_hash IS NULL THEN datetime() END
RETURN p.pool_id AS pool_id
