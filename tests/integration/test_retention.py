"""Retention against the real Neo4j: nothing inside its retention is deleted, everything older is
archived (a readable gzipped NDJSON file, re-read and counted) and then deleted in bounded
batches, and the audit chain still verifies across the archived prefix (from the prefix's last
hash, recorded in the graph in the deletion's own transaction)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.domain.audit import SCHEDULER
from service.domain.error import InvalidInputError
from service.graph.repository import GraphRepository
from service.live.audit import AuditLog
from service.live.retention import Retention, RetentionSettings, read_archive, verify_audit_archive

pytestmark = pytest.mark.neo4j

# Fixed epoch seconds far before any other test's rows (they use the real clock): this test's
# cutoffs never reach another test's requests or workflows in the session's graph.
NOW = 100_000.0


def settings(tmp_path: Path, **kw: Any) -> RetentionSettings:
    return RetentionSettings(**{"requests_s": 1000.0, "workflows_s": 1000.0, "audit_s": 1000.0,
                                "observations_s": 1000.0, "batch": 2, "archive_dir": tmp_path / "archive", **kw})


def run(repo: GraphRepository, cypher: str, **params: Any) -> list[dict[str, Any]]:
    with repo.driver.session() as s:
        return [r.data() for r in s.run(cypher, params)]


@pytest.fixture
def audit_repo(repo: GraphRepository) -> Iterator[GraphRepository]:
    """The session's graph with an empty audit log and no archive (one chain per graph), emptied after."""
    def clear() -> None:
        run(repo, "MATCH (n) WHERE n:AuditEntry OR n:AuditHead OR n:AuditArchive DETACH DELETE n")

    clear()
    yield repo
    clear()


def test_requests_and_workflows_past_retention_are_archived_then_deleted_and_nothing_younger(
        repo: GraphRepository, tenant: str, tmp_path: Path) -> None:
    cutoff = NOW - 1000.0
    requests = [  # (uid, status, finished_at): five past the cutoff, the rest inside it or unfinished
        *[(f"{tenant}-old-{i}", status, cutoff - 10.0 * (i + 1)) for i, status in
          enumerate(["done", "done", "failed", "cancelled", "done"])],
        (f"{tenant}-young", "done", cutoff + 1.0), (f"{tenant}-edge", "done", cutoff),
        (f"{tenant}-queued", "queued", None), (f"{tenant}-leased", "leased", None)]
    run(repo, "UNWIND $rows AS row CREATE (r:Request {uid: row[0], tenant_id: $t, status: row[1], prompt: [1, 2, 3], "
              "output_tokens: [7, 8], arrival: 1.0}) SET r.finished_at = row[2]", rows=requests, t=tenant)
    run(repo, "UNWIND $rows AS row CREATE (w:Workflow {uid: row[0], tenant_id: $t, status: row[1]}) "
              "SET w.finished_at = row[2] "
              "CREATE (w)-[:HAS_STEP]->(:WorkflowStep {uid: row[0] + '/s1', status: row[1]})",
        rows=[(f"{tenant}-wf-old", "done", cutoff - 5.0), (f"{tenant}-wf-young", "done", cutoff + 5.0),
              (f"{tenant}-wf-running", "running", None)], t=tenant)
    retention = Retention(repo, settings(tmp_path))
    plan = retention.plan(NOW)
    assert plan["requests"] >= 5 and plan["workflows"] >= 1  # the session's graph may hold more (older tests: none)

    report = retention.run(NOW)

    left = {r["uid"] for r in run(repo, "MATCH (r:Request {tenant_id: $t}) RETURN r.uid AS uid", t=tenant)}
    assert left == {f"{tenant}-young", f"{tenant}-edge", f"{tenant}-queued", f"{tenant}-leased"}
    archived = [row for f in report["requests"]["files"] for row in read_archive(Path(f))]
    assert sorted(r["uid"] for r in archived if r["tenant_id"] == tenant) == sorted(u for u, _, _ in requests[:5])
    assert report["requests"]["deleted"] == report["requests"]["archived"] == len(archived)
    assert len(report["requests"]["files"]) >= 3  # five rows in batches of two
    sample = next(r for r in archived if r["uid"] == f"{tenant}-old-0")
    assert sample["prompt"] == [1, 2, 3] and sample["output_tokens"] == [7, 8] and sample["status"] == "done"

    wf = {r["uid"] for r in run(repo, "MATCH (w:Workflow {tenant_id: $t}) RETURN w.uid AS uid", t=tenant)}
    assert wf == {f"{tenant}-wf-young", f"{tenant}-wf-running"}
    steps = run(repo, "MATCH (s:WorkflowStep) WHERE s.uid STARTS WITH $t RETURN s.uid AS uid", t=tenant)
    assert {s["uid"] for s in steps} == {f"{tenant}-wf-young/s1", f"{tenant}-wf-running/s1"}
    wf_rows = [row for f in report["workflows"]["files"] for row in read_archive(Path(f))]
    assert [(w["uid"], [s["uid"] for s in w["steps"]]) for w in wf_rows if w["tenant_id"] == tenant] == \
        [(f"{tenant}-wf-old", [f"{tenant}-wf-old/s1"])]

    again = retention.run(NOW)  # nothing left past the cutoff: a second pass archives nothing
    assert again["requests"]["archived"] == 0 and again["workflows"]["archived"] == 0


def write_audit(repo: GraphRepository, ats: list[float]) -> AuditLog:
    """A fresh writer (a process start: the head read back) appending one entry at each time in ``ats``."""
    clock = iter(ats)
    log = AuditLog(repo.audit, clock=lambda: next(clock))

    async def go() -> None:
        await asyncio.to_thread(log.recover)
        for i in range(len(ats)):
            log.record(SCHEDULER, "placement.decision", "placement", f"p{i}", "t1", details={"i": i})
        await log.flush()

    asyncio.run(go())
    return log


def test_the_audit_chain_verifies_across_an_archived_prefix(audit_repo: GraphRepository, tmp_path: Path) -> None:
    repo = audit_repo
    cutoff = NOW - 1000.0
    write_audit(repo, [cutoff - 500.0 + 100.0 * i for i in range(5)] + [cutoff + 10.0 * i for i in range(4)])
    retention = Retention(repo, settings(tmp_path))
    assert retention.plan(NOW)["audit_entries"] == 5

    report = retention.run(NOW)

    assert report["audit"]["deleted"] == report["audit"]["archived"] == 5 and len(report["audit"]["files"]) == 3
    seqs = [r["seq"] for r in run(repo, "MATCH (e:AuditEntry) RETURN e.seq AS seq ORDER BY seq")]
    assert seqs == [6, 7, 8, 9]  # entries inside the retention all kept
    result = repo.audit.verify_audit()
    assert result.ok and result.start_seq == 5 and result.last_seq == 9 and result.entries == 4, result
    through_seq, through_hash, files = repo.audit.audit_archive()
    assert through_seq == 5 and files == report["audit"]["files"]
    archived = verify_audit_archive(files)
    assert archived.ok and (archived.last_seq, archived.last_hash) == (5, through_hash)

    write_audit(repo, [NOW + 1.0, NOW + 2.0])  # the writer goes on after the kept head: the chain still holds
    assert repo.audit.verify_audit().ok and repo.audit.verify_audit().last_seq == 11

    # the archive marker is what lets verification start mid-chain: without it, the prefix shows as removed
    run(repo, "MATCH (a:AuditArchive) SET a.through_hash = $h", h="f" * 64)
    broken = repo.audit.verify_audit()
    assert not broken.ok and broken.first_bad_seq == 6 and "archived prefix" in str(broken.reason)


def test_the_audit_head_entry_is_never_archived(audit_repo: GraphRepository, tmp_path: Path) -> None:
    write_audit(audit_repo, [1.0, 2.0, 3.0])  # all far past any retention
    report = Retention(audit_repo, settings(tmp_path, batch=100)).run(NOW)
    assert report["audit"]["deleted"] == 2
    assert [r["seq"] for r in run(audit_repo, "MATCH (e:AuditEntry) RETURN e.seq AS seq")] == [3]
    assert audit_repo.audit.verify_audit().ok


def test_a_broken_chain_is_left_in_place(audit_repo: GraphRepository, tmp_path: Path) -> None:
    write_audit(audit_repo, [1.0, 2.0, 3.0, 4.0])
    run(audit_repo, "MATCH (e:AuditEntry {seq: 2}) SET e.action = 'tampered'")
    with pytest.raises(Exception, match="broken at seq 2"):
        Retention(audit_repo, settings(tmp_path, batch=100)).run(NOW)
    assert len(run(audit_repo, "MATCH (e:AuditEntry) RETURN e.seq AS seq")) == 4
    assert not (tmp_path / "archive" / "audit").exists() or not any((tmp_path / "archive" / "audit").iterdir())


def test_observations_past_retention_leave_the_file_for_the_archive(repo: GraphRepository, tmp_path: Path) -> None:
    path = tmp_path / "predictor" / "observations.jsonl"
    path.parent.mkdir(parents=True)
    cutoff = NOW - 1000.0
    lines = [{"kind": "call", "at": cutoff - 1.0, "i": 0}, {"kind": "tool", "at": cutoff + 1.0, "i": 1},
             {"kind": "call", "at": cutoff - 2.0, "i": 2}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    report = Retention(repo, settings(tmp_path), observations=path).observations_pass(NOW)
    assert report.archived == 2
    kept = path.read_text().splitlines()
    assert [json.loads(x)["i"] for x in kept[:-1]] == [1] and kept[-1] == "not json"
    assert [r["i"] for r in read_archive(Path(report.files[0]))] == [0, 2]


@pytest.mark.parametrize("field", ["requests_s", "audit_s", "observations_s", "interval_s"])
def test_a_retention_of_zero_is_refused(field: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match=f"{field} must be > 0"):
        settings(tmp_path, **{field: 0.0})
