// Create or update an executor pool: its key hash and device limits (restart recovery).
// @param pool_id: the pool's id
// @param props: map of pool properties (key_hash, allowed_kinds, max_devices, max_mem_bytes)
MERGE (p:ExecutorPool {pool_id: $pool_id})
ON CREATE SET p.created_at = datetime()
SET p += $props
RETURN p.pool_id AS pool_id
