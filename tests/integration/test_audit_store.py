"""The audit log in the real Neo4j: the writer's chain (across restarts, with a second writer, after
a commit whose answer was lost), tampering with the stored entries found by ``audit verify`` at
the first bad seq, and the command's exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from neo4j.exceptions import ServiceUnavailable

from service.cli.main import main
from service.domain.audit import SCHEDULER, AuditRecord, canonical_json, entry_hash
from service.graph.connection import Neo4jSettings
from service.graph.local_server import free_port
from service.graph.repository import GraphRepository
from service.live.audit import AuditLog

pytestmark = pytest.mark.neo4j


@pytest.fixture
def audit_repo(repo: GraphRepository) -> Iterator[GraphRepository]:
    """The session's graph with an empty audit log (the log is one chain per graph), emptied again after."""
    def clear() -> None:
        with repo.driver.session() as s:
            s.run("MATCH (n) WHERE n:AuditEntry OR n:AuditHead DETACH DELETE n").consume()

    clear()
    yield repo
    clear()


def write(repo: GraphRepository, n: int, *, first: int = 0) -> AuditLog:
    """A fresh writer (a process start: the head read back from Neo4j) that appends ``n`` entries."""
    log = AuditLog(repo.audit)

    async def run() -> None:
        await asyncio.to_thread(log.recover)
        for i in range(first, first + n):
            log.record(SCHEDULER, "placement.decision", "placement", f"p{i}", "t1" if i % 2 else None,
                       before={"i": i}, after={"i": i + 1}, details={"notes": [f"step {i}"]})
        await log.flush()

    asyncio.run(run())
    return log


def tamper(repo: GraphRepository, cypher: str, **params: Any) -> None:
    with repo.driver.session() as s:
        s.run(cypher, params).consume()


def entry(repo: GraphRepository, seq: int) -> dict[str, Any]:
    with repo.driver.session() as s:
        return dict(s.run("MATCH (e:AuditEntry {seq: $seq}) RETURN properties(e) AS p", seq=seq).single()["p"])


def shift_from(repo: GraphRepository, seq: int) -> None:
    """Make room at ``seq``: every entry from it on moves one seq up (as an insertion must)."""
    tamper(repo, "MATCH (e:AuditEntry) WHERE e.seq >= $seq SET e.seq = -e.seq - 1", seq=seq)
    tamper(repo, "MATCH (e:AuditEntry) WHERE e.seq < 0 SET e.seq = -e.seq")


def test_the_chain_goes_on_across_restarts_and_a_second_writer(audit_repo: GraphRepository) -> None:
    first = write(audit_repo, 3)
    assert first.head[0] == 3 and first.entries_written == 3
    second = write(audit_repo, 2, first=3)  # a restart: the chain goes on from the stored head
    assert second.head[0] == 5
    result = audit_repo.audit.verify_audit(page=2)
    assert result.ok and result.entries == 5 and result.last_hash == second.head[1]
    assert [e["target_id"] for e in audit_repo.audit.audit_log(limit=10)] == [f"p{i}" for i in range(5)]

    a, b = AuditLog(audit_repo.audit), AuditLog(audit_repo.audit)  # two writers on one graph: no fork, no gap

    async def interleave() -> None:
        for log in (a, b):
            await asyncio.to_thread(log.recover)
        for i in range(3):
            a.record(SCHEDULER, "placement.decision", "placement", f"a{i}")
            b.record(SCHEDULER, "placement.decision", "placement", f"b{i}")
        await a.flush()
        await b.flush()  # its seqs 6-8 are taken: it chains after a's

    asyncio.run(interleave())
    assert (a.head[0], b.head[0]) == (8, 11)
    result = audit_repo.audit.verify_audit()
    assert result.ok and result.entries == 11


def test_a_batch_whose_commit_answer_was_lost_is_written_once(audit_repo: GraphRepository,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    log = AuditLog(audit_repo.audit)
    real = audit_repo.audit.append_audit_entries
    calls: list[int] = []

    def commit_then_fail(rows: list[dict[str, Any]], head: tuple[int, str]) -> int:
        calls.append(len(rows))
        out = real(rows, head)
        if len(calls) == 1:
            raise ServiceUnavailable("connection lost after the commit")
        return out

    async def run() -> None:
        await asyncio.to_thread(log.recover)
        monkeypatch.setattr(audit_repo.audit, "append_audit_entries", commit_then_fail)
        done = log.record(SCHEDULER, "placement.decision", "placement", "x", wait=True)
        with pytest.raises(ServiceUnavailable):
            await log.flush()
        assert log.pending == 1 and done is not None and not done.done()
        log.record(SCHEDULER, "placement.decision", "placement", "y")
        await log.flush()
        assert done.result() == 1

    asyncio.run(run())
    assert calls == [1, 1]  # "x" was found written; only "y" went again
    assert [e["target_id"] for e in audit_repo.audit.audit_log(limit=10)] == ["x", "y"]
    assert audit_repo.audit.verify_audit().ok


@pytest.fixture
def chain8(audit_repo: GraphRepository) -> GraphRepository:
    write(audit_repo, 8)
    assert audit_repo.audit.verify_audit().ok
    return audit_repo


def first_bad(repo: GraphRepository) -> tuple[int | None, str]:
    result = repo.audit.verify_audit(page=3)
    assert not result.ok
    return result.first_bad_seq, result.reason or ""


def test_an_altered_field_is_found(chain8: GraphRepository) -> None:
    tamper(chain8, "MATCH (e:AuditEntry {seq: 5}) SET e.after = $after", after=canonical_json({"i": 99}))
    seq, why = first_bad(chain8)
    assert seq == 5 and "does not match its fields" in why


def test_a_deleted_entry_is_found(chain8: GraphRepository) -> None:
    tamper(chain8, "MATCH (e:AuditEntry {seq: 4}) DETACH DELETE e")
    seq, why = first_bad(chain8)
    assert seq == 4 and "entry 4 missing" in why


def test_deleted_newest_entries_are_found_by_the_head(chain8: GraphRepository) -> None:
    tamper(chain8, "MATCH (e:AuditEntry) WHERE e.seq >= 7 DETACH DELETE e")
    seq, why = first_bad(chain8)
    assert seq == 7 and "entries 7-8 missing" in why
    log = write(chain8, 1, first=8)  # a restart goes on after the head: the gap stays visible
    assert log.head[0] == 9
    assert first_bad(chain8)[0] == 7


def test_two_swapped_entries_are_found(chain8: GraphRepository) -> None:
    tamper(chain8, "MATCH (e:AuditEntry {seq: 3}) SET e.seq = -3")
    tamper(chain8, "MATCH (e:AuditEntry {seq: 4}) SET e.seq = 3")
    tamper(chain8, "MATCH (e:AuditEntry {seq: -3}) SET e.seq = 4")
    seq, why = first_bad(chain8)
    assert seq == 3 and "does not match its fields" in why


def forged_entry(seq: int, prev_hash: str, *, chained: bool) -> dict[str, Any]:
    rec = AuditRecord(1_800_000_000.0, "admin", "admin", "tenant.key.revoke", "tenant", "t1", "t1", None, None, None)
    props = rec.chained(seq, prev_hash).row()
    if not chained:  # a hash computed without the chain: over the fields alone
        fields = {k: v for k, v in props.items() if k not in ("prev_hash", "hash")}
        props["hash"] = entry_hash(fields, "")
    return {k: v for k, v in props.items() if v is not None}


def test_an_inserted_entry_with_a_hash_made_without_the_chain_is_found(chain8: GraphRepository) -> None:
    prev = entry(chain8, 4)["hash"]
    shift_from(chain8, 5)
    tamper(chain8, "CREATE (e:AuditEntry) SET e = $props", props=forged_entry(5, prev, chained=False))
    seq, why = first_bad(chain8)
    assert seq == 5 and "does not match its fields" in why


def test_an_inserted_entry_linked_to_the_wrong_entry_is_found(chain8: GraphRepository) -> None:
    older = entry(chain8, 2)["hash"]
    shift_from(chain8, 5)
    tamper(chain8, "CREATE (e:AuditEntry) SET e = $props", props=forged_entry(5, older, chained=True))
    seq, why = first_bad(chain8)
    assert seq == 5 and "links to entry 2" in why


def verify_cli(neo4j: Neo4jSettings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
               *args: str) -> tuple[int, str]:
    for k, v in neo4j.env().items():
        monkeypatch.setenv(k, v)
    code = main(["audit", "verify", *args])
    return code, capsys.readouterr().out


def test_verify_exit_codes(chain8: GraphRepository, neo4j: Neo4jSettings, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out = verify_cli(neo4j, monkeypatch, capsys, "--json", "--page", "3")
    result = json.loads(out)
    assert code == 0 and result["ok"] and result["entries"] == 8
    anchor = f"5:{entry(chain8, 5)['hash']}"
    code, out = verify_cli(neo4j, monkeypatch, capsys, "--anchor", anchor)
    assert code == 0 and "intact: 8 entries" in out and "8:" in out
    tamper(chain8, "MATCH (e:AuditEntry {seq: 6}) SET e.actor = 'mallory'")
    code, out = verify_cli(neo4j, monkeypatch, capsys)
    assert code == 1 and out.startswith("BROKEN at seq 6:")
    code, _ = verify_cli(neo4j, monkeypatch, capsys, "--anchor", "5:nothex")
    assert code == 2
    monkeypatch.setenv("SLICESCHED_NEO4J_URI", f"bolt://127.0.0.1:{free_port()}")  # nobody listens there
    assert main(["audit", "verify"]) == 3
