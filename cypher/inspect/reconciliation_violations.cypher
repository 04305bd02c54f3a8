// Live requests and Slices that disagree (admin): every request finished since $since must be
// done with exactly one done Slice and a result, or not done with no done Slice; no Slice may be
// open (no end) when its request is finished, or when it started before $stale_before (a lease
// of a previous process that restart did not close). One row per violation; none is the goal.
// @param since: epoch seconds; requests that arrived earlier are not checked (retention deletes old Slices)
// @param stale_before: epoch seconds; an open Slice that started earlier is a violation
CALL () {
  MATCH (r:Request)
  WHERE r.prompt IS NOT NULL AND r.arrival >= $since
  OPTIONAL MATCH (s:Slice {state: 'done'})-[:SERVES]->(r)
  WITH r, count(s) AS done_slices
  WITH r, done_slices,
       CASE
         WHEN r.status = 'done' AND done_slices <> 1 THEN 'done_without_one_done_slice'
         WHEN r.status = 'done' AND (r.output_tokens IS NULL OR size(r.output_tokens) = 0) THEN 'done_without_result'
         WHEN r.status <> 'done' AND done_slices > 0 THEN 'done_slice_but_request_' + r.status
       END AS kind
  WHERE kind IS NOT NULL
  RETURN kind, r.uid AS request, r.tenant_id AS tenant_id, 'done slices: ' + toString(done_slices) AS detail
  UNION ALL
  MATCH (s:Slice)-[:SERVES]->(r:Request)
  WHERE s.live AND s.end_wall IS NULL AND (r.status IN ['done', 'cancelled', 'failed'] OR s.start_wall < $stale_before)
  RETURN CASE WHEN r.status IN ['done', 'cancelled', 'failed'] THEN 'open_slice_of_finished_request'
              ELSE 'stale_open_slice' END AS kind,
         r.uid AS request, r.tenant_id AS tenant_id, 'slice ' + s.uid + ' state ' + s.state AS detail
}
RETURN kind, request, tenant_id, detail
ORDER BY kind, request
