"""The audit log's hash chain without Neo4j: entries chain by hash, and the verifier names the first
entry that an alteration, a removal, a reordering or an insertion breaks, and why."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

import pytest

from service.domain.audit import (
    FIELDS,
    GENESIS,
    AuditEntry,
    AuditRecord,
    ChainVerifier,
    VerifyResult,
    canonical_json,
    chain,
    entry_hash,
    json_text,
)


def record(i: int, tenant: str | None = "t1") -> AuditRecord:
    return AuditRecord(1_700_000_000.0 + i, "admin", "admin", "tenant.create", "tenant", f"t{i}", tenant,
                       None, json_text({"weight": 1.5, "sla_class": "gold", "n": i}), None)


def entries(n: int = 8) -> list[AuditEntry]:
    return chain(record(i) for i in range(n))


def verify(es: list[AuditEntry], head: tuple[int, str] | None = None,
           anchor: tuple[int, str] | None = None) -> VerifyResult:
    v = ChainVerifier(anchor)
    rows = [[getattr(e, f) for f in FIELDS] for e in es]
    v.feed(rows[:3])  # in pages, as the store feeds it
    v.feed(rows[3:])
    if head is None and es:
        head = (es[-1].seq, es[-1].hash)
    return v.finish(head)


def forged(e: AuditEntry, **changes: Any) -> AuditEntry:
    """``e`` with ``changes`` and a hash recomputed over its fields and its (possibly changed) prev_hash."""
    changed = dataclasses.replace(e, **changes)
    return dataclasses.replace(changed, hash=entry_hash(changed.row(), changed.prev_hash))


def test_entries_chain_from_the_genesis_hash() -> None:
    es = entries(3)
    assert [e.seq for e in es] == [1, 2, 3]
    assert es[0].prev_hash == GENESIS and es[1].prev_hash == es[0].hash and es[2].prev_hash == es[1].hash
    body = {f: getattr(es[1], f) for f in FIELDS if f != "hash"}
    assert es[1].hash == hashlib.sha256(canonical_json(body).encode()).hexdigest()
    more = chain([record(3)], es[-1].seq, es[-1].hash)  # the chain goes on after a head
    assert more[0].seq == 4 and more[0].prev_hash == es[-1].hash
    result = verify(es + more)
    assert result.ok and result.entries == 4 and result.last_seq == 4 and result.first_bad_seq is None


def test_canonical_json_is_one_text_per_value() -> None:
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'
    assert json_text(None) is None
    assert json.loads(json_text({"x": (1, 2), "s": {3, 1}, "inf": math.inf, "nan": math.nan}) or "") == \
        {"x": [1, 2], "s": [1, 3], "inf": "inf", "nan": "nan"}


def test_an_empty_log_is_intact_and_a_head_without_entries_is_not() -> None:
    assert verify([], head=None).ok
    result = verify([], head=(2, "a" * 64))
    assert not result.ok and result.first_bad_seq == 1 and "entries 1-2 missing" in (result.reason or "")


def test_an_altered_field_names_its_entry() -> None:
    es = entries()
    es[4] = dataclasses.replace(es[4], actor="mallory")
    result = verify(es)
    assert not result.ok and result.first_bad_seq == 5 and "does not match its fields" in (result.reason or "")
    assert result.last_seq == 4 and result.entries == 5


def test_an_altered_entry_with_a_recomputed_hash_breaks_the_next_link() -> None:
    es = entries()
    es[4] = forged(es[4], after=json_text({"weight": 99}))
    result = verify(es)
    assert not result.ok and result.first_bad_seq == 6 and "prev_hash is not the hash of entry 5" in (result.reason or "")


def test_a_removed_entry_is_named_by_its_seq() -> None:
    es = entries()
    del es[3]
    result = verify(es)
    assert not result.ok and result.first_bad_seq == 4 and "entry 4 missing" in (result.reason or "")
    es = entries()
    result = verify(es[:5], head=(es[-1].seq, es[-1].hash))  # the newest ones gone: the head shows it
    assert not result.ok and result.first_bad_seq == 6 and "entries 6-8 missing" in (result.reason or "")
    result = verify(es[2:])  # the oldest ones gone
    assert not result.ok and result.first_bad_seq == 1


def test_two_swapped_entries_are_found_at_the_first() -> None:
    es = entries()
    a, b = es[2], es[3]  # swap their places (each takes the other's seq)
    es[2], es[3] = dataclasses.replace(b, seq=3), dataclasses.replace(a, seq=4)
    result = verify(es)
    assert not result.ok and result.first_bad_seq == 3 and "does not match its fields" in (result.reason or "")
    es = entries()  # and with their hashes recomputed for their new seq
    a, b = es[2], es[3]
    es[2], es[3] = forged(b, seq=3), forged(a, seq=4)
    result = verify(es)
    assert not result.ok and result.first_bad_seq == 3
    assert "prev_hash is not the hash of entry 2: it links to no entry before it" in (result.reason or "")


def test_an_inserted_entry_is_found_whatever_its_hash() -> None:
    es = entries()
    fake = AuditRecord(1_700_000_003.5, "admin", "admin", "tenant.key.revoke", "tenant", "t3", "t1", None, None, None)
    shifted = es[:4] + [dataclasses.replace(e, seq=e.seq + 1) for e in es[4:]]
    # a hash computed without the chain (over its fields alone, no prev_hash)
    alone = fake.chained(5, GENESIS)
    no_chain = dataclasses.replace(alone, prev_hash="", hash=hashlib.sha256(canonical_json(
        {f: getattr(alone, f) for f in FIELDS[:-2]}).encode()).hexdigest())
    result = verify([*shifted[:4], no_chain, *shifted[4:]])
    assert not result.ok and result.first_bad_seq == 5 and "does not match its fields" in (result.reason or "")
    # a hash recomputed over its fields, but linked to an older entry than the one before it
    wrong_link = fake.chained(5, es[1].hash)
    result = verify([*shifted[:4], wrong_link, *shifted[4:]])
    assert not result.ok and result.first_bad_seq == 5 and "links to entry 2" in (result.reason or "")
    # a perfect link: the entry after it, moved to a new seq, breaks instead
    linked = fake.chained(5, es[3].hash)
    result = verify([*shifted[:4], linked, *shifted[4:]])
    assert not result.ok and result.first_bad_seq == 6
    # appended after the head, hashed and linked: the head shows it
    tail = chain([fake], es[-1].seq, es[-1].hash)
    result = verify(es + tail, head=(es[-1].seq, es[-1].hash))
    assert not result.ok and result.first_bad_seq == 9 and "runs past its head" in (result.reason or "")


def test_a_rewritten_chain_fails_its_anchor() -> None:
    es = entries()
    anchor = (5, es[4].hash)
    assert verify(es, anchor=anchor).ok
    rewritten = chain([record(i) for i in range(4)] + [dataclasses.replace(record(4), actor="mallory")]
                      + [record(i) for i in range(5, 8)])
    assert verify(rewritten).ok  # self-consistent, head and all
    result = verify(rewritten, anchor=anchor)
    assert not result.ok and result.first_bad_seq == 5 and "anchor" in (result.reason or "")
    result = verify(es[:3], anchor=anchor)
    assert not result.ok and result.first_bad_seq == 4


@pytest.mark.parametrize("seq", [0, "3", None])
def test_a_bad_seq_is_a_broken_chain(seq: Any) -> None:
    es = entries(3)
    es[1] = dataclasses.replace(es[1], seq=seq)
    result = verify(es)
    assert not result.ok and result.first_bad_seq in (2, seq)
