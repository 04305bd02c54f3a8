// Create or update a batch of tensors (weights are shared by a model's phases, hence MERGE).
// @param rows: [{uid, tenant_id, model_uid, phase, tensor_id, kind, shape, dtype, size_bytes}]
UNWIND $rows AS row
MERGE (t:Tensor {uid: row.uid})
SET t += row
