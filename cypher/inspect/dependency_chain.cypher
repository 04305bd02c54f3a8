// An operator's dependency chain: every operator it transitively waits for, nearest first.
// @param tenant_id: owner of the model
// @param model_id: the model
// @param phase: prefill or decode
// @param op_id: the operator (e.g. op00042_linear_3) or its index as a string
MATCH (o:Operator {model_uid: $tenant_id + '/' + $model_id, phase: $phase})
WHERE o.op_id = $op_id OR toString(o.index) = $op_id
MATCH (o)<-[:PRECEDES*1..]-(a:Operator)
WITH DISTINCT o, a
RETURN o.op_id AS operator, a.op_id AS depends_on, a.kind AS kind, a.layer AS layer,
       a.flops AS flops, o.index - a.index AS distance
ORDER BY a.index DESC
