// Models registered through the live service (restart recovery).
MATCH (t:Tenant)-[:OWNS]->(m:Model)
WHERE m.family IS NOT NULL
RETURN t.tenant_id AS tenant_id, m.model_id AS model_id, m.family AS family, m.seed AS seed,
       m.replicas AS replicas, m.path AS path, m.created_at.epochSeconds AS created_at
ORDER BY tenant_id, model_id
