// A model phase's name, transformer layers (one more than its largest operator layer) and the
// tokens of the batch it was traced at: what a slice cut checks before it runs.
// No row: no such model; operators = 0: the phase is not imported.
// @param model_uid: the model
// @param phase: prefill or decode
MATCH (m:Model {uid: $model_uid})
OPTIONAL MATCH (o:Operator {model_uid: $model_uid, phase: $phase})
RETURN m.name AS name, count(o) AS operators, coalesce(max(o.layer), -1) + 1 AS num_layers,
       m[$phase + '_tokens'] AS tokens
