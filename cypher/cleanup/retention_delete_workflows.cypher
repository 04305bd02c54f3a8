// Retention: delete the archived workflows named by uid with their steps, each only while it
// is still ended before $before.
// @param uids: workflow uids (archived)
// @param before: epoch seconds
UNWIND $uids AS uid
MATCH (w:Workflow {uid: uid})
WHERE w.finished_at < $before AND w.status IN ['done', 'failed', 'cancelled']
OPTIONAL MATCH (w)-[:HAS_STEP]->(s:WorkflowStep)
DETACH DELETE s
WITH DISTINCT w
DETACH DELETE w
RETURN count(*) AS deleted
