// Retention: delete the archived requests named by uid, each only while it is still finished
// before $before (a request that changed since it was read stays).
// @param uids: request uids (archived)
// @param before: epoch seconds
UNWIND $uids AS uid
MATCH (r:Request {uid: uid})
WHERE r.finished_at < $before AND r.status IN ['done', 'failed', 'cancelled']
DETACH DELETE r
RETURN count(*) AS deleted
