// Executor pools with their key hashes (null: revoked) and device limits (restart recovery).
MATCH (p:ExecutorPool)
RETURN p.pool_id AS pool_id, p.key_hash AS key_hash, p.allowed_kinds AS allowed_kinds,
       p.max_devices AS max_devices, p.max_mem_bytes AS max_mem_bytes
ORDER BY pool_id
