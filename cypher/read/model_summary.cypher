// Operator, tensor and FLOP totals of one model phase.
// @param model_uid: the model
// @param phase: prefill or decode
MATCH (o:Operator {model_uid: $model_uid, phase: $phase})
WITH count(o) AS operators, sum(o.flops) AS flops
OPTIONAL MATCH (t:Tensor {model_uid: $model_uid}) WHERE t.kind = 'weight' OR t.phase = $phase
RETURN operators, flops, count(t) AS tensors,
       sum(CASE t.kind WHEN 'weight' THEN t.size_bytes ELSE 0 END) AS weight_bytes
