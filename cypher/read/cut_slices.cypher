// Cut one phase of a model's operator graph into slices (contract: service/core/cut.py): one row
// per slice, in execution order. Slice g holds layers [g * $layers, (g + 1) * $layers), or with
// $sublayer layer g / 2's attention part (g even: up to its second norm operator) or MLP part
// (g odd: from it). Operators outside the layers (layer -1) join the first slice when they come
// before the first layer operator, else the last. A slice's inputs: distinct activation/input
// tensors it reads and does not write; outputs: activations it writes that another slice reads
// or nobody does; KV: each kv_cache tensor shared equally by the operators touching it.
// Lists keep operator order by list comprehension over the index-ordered operators.
// The caller refuses a cut where a slice has no operator of its layers (layer_ops = 0) or where its
// operators are not one run of indices (contiguous false).
// tokens: the traced batch's tokens (Model.<phase>_tokens, written at import).
// The caller checks first that $layers divides the model's layers (read/model_layers).
// @param model_uid: the model
// @param phase: prefill or decode
// @param layers: layers per slice (>= 1; 1 with $sublayer)
// @param sublayer: cut each layer into its attention and MLP parts
MATCH (m:Model {uid: $model_uid})
MATCH (o:Operator {model_uid: $model_uid, phase: $phase})
WITH m, o
ORDER BY o.index
WITH m[$phase + '_tokens'] AS tokens, collect(o) AS ops
WITH tokens, ops, [o IN ops WHERE o.layer >= 0] AS inner
WITH tokens, ops, inner, reduce(n = 0, o IN inner | CASE WHEN o.layer + 1 > n THEN o.layer + 1 ELSE n END) AS num_layers
WITH tokens, ops, num_layers,
     CASE WHEN size(inner) = 0 THEN size(ops) ELSE inner[0].index END AS first_inner,
     CASE WHEN $sublayer THEN 2 * num_layers ELSE num_layers / $layers END AS num_slices,
     // per layer, the index of its second norm operator, where its MLP part starts (null: none)
     CASE WHEN $sublayer
       THEN [l IN range(0, num_layers - 1) | ([o IN inner WHERE o.layer = l AND o.kind = 'norm'][1]).index]
       ELSE [] END AS mlp_start
WITH tokens, ops, num_slices, [o IN ops |
       CASE WHEN o.layer < 0 THEN CASE WHEN o.index < first_inner THEN 0 ELSE num_slices - 1 END
            WHEN $sublayer THEN 2 * o.layer + CASE WHEN o.index >= mlp_start[o.layer] THEN 1 ELSE 0 END
            ELSE o.layer / $layers END] AS slice_of
UNWIND range(0, num_slices - 1) AS s
WITH tokens, num_slices, slice_of, s, [i IN range(0, size(ops) - 1) WHERE slice_of[i] = s | ops[i]] AS members
CALL (members, s, slice_of) {
  UNWIND members AS o
  MATCH (o)-[:READS]->(t:Tensor)
  WHERE t.kind IN ['activation', 'input']
  WITH DISTINCT t
  OPTIONAL MATCH (w:Operator)-[:WRITES]->(t)
  WITH t, w
  WHERE w IS NULL OR slice_of[w.index] <> s
  RETURN sum(t.size_bytes) AS input_bytes
}
CALL (members, s, slice_of) {
  UNWIND members AS o
  MATCH (o)-[:WRITES]->(t:Tensor {kind: 'activation'})
  OPTIONAL MATCH (r:Operator)-[:READS]->(t)
  WITH t, collect(slice_of[r.index]) AS readers
  WHERE size(readers) = 0 OR any(x IN readers WHERE x <> s)
  RETURN sum(t.size_bytes) AS output_bytes
}
CALL (members) {
  UNWIND members AS o
  MATCH (o)-[:READS]->(t:Tensor {kind: 'weight'})
  WITH DISTINCT t
  ORDER BY t.tensor_id
  RETURN collect(t.tensor_id) AS weight_ids, sum(t.size_bytes) AS weight_bytes
}
CALL (members) {
  UNWIND members AS o
  MATCH (o)-[:READS|WRITES]->(t:Tensor {kind: 'kv_cache'})
  WITH t, count(DISTINCT o) AS mine
  MATCH (x:Operator)-[:READS|WRITES]->(t)
  WITH t, mine, count(DISTINCT x) AS touching
  RETURN sum(t.size_bytes * mine / touching) AS kv_bytes
}
CALL (members, s, slice_of, num_slices) {
  UNWIND members AS o
  MATCH (p:Operator)-[:PRECEDES]->(o)
  WITH collect(DISTINCT slice_of[p.index]) AS producers
  RETURN [x IN range(0, num_slices - 1) WHERE x <> s AND x IN producers] AS predecessors
}
RETURN s AS index,
       CASE WHEN $sublayer THEN s / 2 ELSE s * $layers END AS first_layer,
       CASE WHEN $sublayer THEN s / 2 ELSE s * $layers + $layers - 1 END AS last_layer,
       CASE WHEN NOT $sublayer THEN 'layers' WHEN s % 2 = 0 THEN 'attention' ELSE 'mlp' END AS part,
       [o IN members | o.op_id] AS op_ids, size([o IN members WHERE o.layer >= 0]) AS layer_ops,
       size(members) > 0 AND members[-1].index - members[0].index + 1 = size(members) AS contiguous,
       input_bytes, output_bytes, weight_ids, weight_bytes, kv_bytes,
       reduce(w = 0, o IN members | CASE WHEN o.workspace_bytes > w THEN o.workspace_bytes ELSE w END) AS workspace_bytes,
       reduce(f = 0, o IN members | f + o.flops) AS flops, predecessors, tokens
ORDER BY index
