// Create a batch of operators of one model phase and attach them to the model.
// @param model_uid: the model they belong to
// @param rows: [{uid, tenant_id, model_uid, phase, op_id, index, kind, target, layer, flops, bytes_read, bytes_written, workspace_bytes}]
MATCH (m:Model {uid: $model_uid})
UNWIND $rows AS row
CREATE (o:Operator)
SET o = row
CREATE (m)-[:HAS_OPERATOR]->(o)
