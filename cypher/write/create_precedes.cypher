// Create producer-to-consumer dependency edges between operators.
// @param rows: [{src, dst}] operator uids
UNWIND $rows AS row
MATCH (a:Operator {uid: row.src})
MATCH (b:Operator {uid: row.dst})
CREATE (a)-[:PRECEDES]->(b)
