"""The named query reconciliation_violations finds every kind of disagreement between live
requests and their Slices, and nothing where they agree (real Neo4j; rows written directly)."""

from __future__ import annotations

import time

from service.graph.repository import GraphRepository


def _write(repo: GraphRepository, tenant: str, now: float) -> None:
    rows = [  # (request uid, status, output tokens, [(slice uid, state, end)])
        ("ok-done", "done", [1, 2], [("s-ok", "done", now)]),
        ("ok-queued", "queued", [], [("s-exp", "expired", now)]),
        ("no-slice", "done", [1], []),
        ("two-slices", "done", [1], [("s-2a", "done", now), ("s-2b", "done", now)]),
        ("no-result", "done", [], [("s-nr", "done", now)]),
        ("slice-not-done", "queued", [], [("s-nd", "done", now)]),
        ("open-finished", "cancelled", [], [("s-of", "running", None)]),
        ("stale-open", "leased", [], [("s-so", "running", None)]),
    ]
    with repo.driver.session() as s:
        for uid, status, out, slices in rows:
            s.run("CREATE (r:Request {uid: $uid, tenant_id: $t, prompt: [1], arrival: $now, status: $status, "
                  "output_tokens: $out})", uid=f"{tenant}-{uid}", t=tenant, now=now, status=status, out=out).consume()
            for sid, state, end in slices:
                s.run("MATCH (r:Request {uid: $uid}) CREATE (:Slice {uid: $sid, live: true, state: $state, "
                      "start_wall: $start, end_wall: $end})-[:SERVES]->(r)", uid=f"{tenant}-{uid}",
                      sid=f"{tenant}-{sid}", state=state, start=now - 100, end=end).consume()


def test_each_violation_is_found_and_agreement_is_not(repo: GraphRepository, tenant: str) -> None:
    now = time.time()
    _write(repo, tenant, now)
    table = repo.inspection.run_named("reconciliation_violations", {"since": now - 1, "stale_before": now - 50})
    found = {(row[0], row[1].removeprefix(f"{tenant}-")) for row in table.rows if row[2] == tenant}
    assert found == {
        ("done_without_one_done_slice", "no-slice"),
        ("done_without_one_done_slice", "two-slices"),
        ("done_without_result", "no-result"),
        ("done_slice_but_request_queued", "slice-not-done"),
        ("open_slice_of_finished_request", "open-finished"),
        ("stale_open_slice", "stale-open"),
    }
    # An open lease younger than stale_before is a lease in progress, not a violation.
    table = repo.inspection.run_named("reconciliation_violations", {"since": now - 1, "stale_before": now - 500})
    assert ("stale_open_slice", f"{tenant}-stale-open") not in {(r[0], r[1]) for r in table.rows}
    with repo.driver.session() as s:
        s.run("MATCH (n) WHERE (n:Request OR n:Slice) AND n.uid STARTS WITH $t DETACH DELETE n", t=tenant).consume()
