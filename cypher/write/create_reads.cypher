// Create operator-reads-tensor edges.
// @param rows: [{op, tensor}] uids
UNWIND $rows AS row
MATCH (o:Operator {uid: row.op})
MATCH (t:Tensor {uid: row.tensor})
CREATE (o)-[:READS]->(t)
