// A model's heaviest operators by FLOPs, with bytes moved and arithmetic intensity.
// @param tenant_id: owner of the model
// @param model_id: the model
// @param limit: how many rows
MATCH (o:Operator {model_uid: $tenant_id + '/' + $model_id})
RETURN o.phase AS phase, o.op_id AS operator, o.kind AS kind, o.layer AS layer, o.flops AS flops,
       o.bytes_read + o.bytes_written AS bytes_moved,
       round(toFloat(o.flops) / (o.bytes_read + o.bytes_written + 1), 2) AS flops_per_byte
ORDER BY flops DESC, operator
LIMIT toInteger($limit)
