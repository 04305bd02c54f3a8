// Requests of the live service, unfinished first (restart recovery); finished ones since $since.
// Each comes with the number of Slices (leases) that served it, so a restart counts attempts
// that a previous process granted but did not write.
// @param since: epoch seconds; finished requests older than this are not loaded
MATCH (r:Request)
WHERE r.prompt IS NOT NULL AND (NOT r.status IN ['done', 'cancelled', 'failed'] OR r.finished_at >= $since)
RETURN r {.*, slices: COUNT { (:Slice)-[:SERVES]->(r) }} AS request
ORDER BY r.arrival
