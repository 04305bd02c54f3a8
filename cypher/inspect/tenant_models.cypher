// Each tenant's models with operator counts, total FLOPs per phase and where the weights live.
MATCH (t:Tenant)-[:OWNS]->(m:Model)
OPTIONAL MATCH (m)-[:HAS_OPERATOR]->(o:Operator)
WITH t, m, o.phase AS phase, count(o) AS operators, sum(o.flops) AS flops
OPTIONAL MATCH (w:Tensor {model_uid: m.uid, kind: 'weight'})-[:RESIDES_ON]->(d:Device)
WITH t, m, phase, operators, flops, collect(DISTINCT d.device_id) AS devices
RETURN t.tenant_id AS tenant, m.model_id AS model, m.name AS config, phase, operators, flops,
       m.weight_bytes AS weight_bytes, devices
ORDER BY tenant, model, phase
