// Place slices: create or move each Slice (state 'planned') ON its device, then its DEPENDS_ON
// edges to producer slices, its COVERS edges to the operators it runs and its AFTER edge to its
// predecessor slice (producers and predecessors may be in the same batch). $covers and $after
// hold only the slices that name operators or a predecessor (a slice without them costs nothing
// more); each replaces that slice's edges of its kind. Returns how many slices were placed (a row
// naming an unknown device is skipped, so the caller compares `placed` with its row count), how
// many COVERS and AFTER edges were written (an unknown operator or predecessor is skipped: the
// caller compares) and the [device_id, slice uid] pairs whose busy windows changed (the caller
// refreshes them in the same transaction: refresh_busy_windows).
// @param rows: [{uid, tenant_id, model_uid, device_id, start_s, end_s, resident_bytes, depends_on: [producer uid]}]
// @param covers: [{uid, phase, op_uids: [Operator uid]}]
// @param after: [{uid, after: predecessor Slice uid}]
CALL () {
  UNWIND $rows AS row
  MATCH (d:Device {device_id: row.device_id})
  MERGE (s:Slice {uid: row.uid})
  SET s.tenant_id = row.tenant_id, s.model_uid = row.model_uid, s.device_id = row.device_id,
      s.start_s = row.start_s, s.end_s = row.end_s, s.resident_bytes = row.resident_bytes, s.state = 'planned'
  WITH s, d
  CALL (s) {
    OPTIONAL MATCH (s)-[old:ON]->(o:Device)
    DELETE old
    RETURN collect([o.device_id, s.uid]) AS left
  }
  CREATE (s)-[:ON]->(d)
  RETURN count(s) AS placed, collect([d.device_id, s.uid]) + reduce(acc = [], ds IN collect(left) | acc + ds) AS touched
}
CALL () {
  UNWIND $rows AS row
  UNWIND coalesce(row.depends_on, []) AS producer_uid
  MATCH (s:Slice {uid: row.uid})
  MATCH (p:Slice {uid: producer_uid})
  MERGE (s)-[:DEPENDS_ON]->(p)
  RETURN count(*) AS dependencies
}
CALL () {
  UNWIND $covers AS row
  MATCH (s:Slice {uid: row.uid})
  SET s.phase = row.phase
  WITH s, row
  CALL (s) {
    OPTIONAL MATCH (s)-[old:COVERS]->(:Operator)
    DELETE old
  }
  UNWIND row.op_uids AS op_uid
  MATCH (o:Operator {uid: op_uid})
  CREATE (s)-[:COVERS]->(o)
  RETURN count(*) AS covered
}
CALL () {
  UNWIND $after AS row
  MATCH (s:Slice {uid: row.uid})
  CALL (s) {
    OPTIONAL MATCH (s)-[old:AFTER]->(:Slice)
    DELETE old
  }
  MATCH (p:Slice {uid: row.after})
  CREATE (s)-[:AFTER]->(p)
  RETURN count(*) AS afters
}
RETURN placed, dependencies, covered, afters, touched
