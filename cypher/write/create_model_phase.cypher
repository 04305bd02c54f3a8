// Write one phase of a model's operator graph in one statement: tensors, operators and every
// PRECEDES / READS / WRITES / HAS_OPERATOR edge. Edges name their ends by position in the
// lists ($operators[i], $weights + $tensors [j]) instead of by uid, which saves an index lookup
// per edge; `ordered` proves the collected lists kept their input order (the caller aborts if not).
// @param model_uid: the model, which must exist
// @param weights: [{uid, tenant_id, model_uid, phase, tensor_id, kind, shape, dtype, size_bytes}] shared by phases: merged
// @param tensors: phase-local tensors (inputs, activations, KV cache), same fields: created
// @param operators: [{uid, tenant_id, model_uid, phase, op_id, index, kind, target, layer, flops, bytes_read, bytes_written, workspace_bytes}]
// @param precedes: [[producer position, consumer position]]
// @param reads: [[operator position, tensor position]]
// @param writes: [[operator position, tensor position]]
MATCH (m:Model {uid: $model_uid})
CALL () {
  UNWIND $weights AS row
  MERGE (t:Tensor {uid: row.uid})
  SET t += row
  RETURN collect(t) AS ws
}
CALL () {
  UNWIND $tensors AS row
  CREATE (t:Tensor)
  SET t = row
  RETURN collect(t) AS ps
}
CALL (m) {
  UNWIND $operators AS row
  CREATE (o:Operator)
  SET o = row
  CREATE (m)-[:HAS_OPERATOR]->(o)
  RETURN collect(o) AS os
}
WITH os, ws + ps AS ts
CALL (os) {
  UNWIND $precedes AS e
  WITH os[e[0]] AS a, os[e[1]] AS b
  CREATE (a)-[:PRECEDES]->(b)
}
CALL (os, ts) {
  UNWIND $reads AS e
  WITH os[e[0]] AS o, ts[e[1]] AS t
  CREATE (o)-[:READS]->(t)
}
CALL (os, ts) {
  UNWIND $writes AS e
  WITH os[e[0]] AS o, ts[e[1]] AS t
  CREATE (o)-[:WRITES]->(t)
}
WITH os, ts, $weights + $tensors AS rows
RETURN size(os) AS operators, size(ts) AS tensors,
       all(i IN range(0, size(os) - 1) WHERE os[i].index = i) AND
       all(i IN range(0, size(ts) - 1) WHERE ts[i].uid = rows[i].uid) AS ordered
