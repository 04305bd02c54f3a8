// Remove one phase's operators and its non-weight tensors (before a re-import).
// @param model_uid: the model
// @param phase: prefill or decode
OPTIONAL MATCH (o:Operator {model_uid: $model_uid, phase: $phase})
DETACH DELETE o
WITH count(*) AS ignored
OPTIONAL MATCH (t:Tensor {model_uid: $model_uid, phase: $phase})
DETACH DELETE t
