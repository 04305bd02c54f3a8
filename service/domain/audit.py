"""The audit log's entries, their hash chain, and its verification (pure: no I/O).

An entry says who (``actor``, ``actor_role``) did what (``action``) to what (``target_kind``,
``target_id``) of which tenant (``tenant_id``; ``None``: the platform's, seen by admins only),
when (``at``, epoch seconds), with the state ``before`` and ``after`` and free ``details``
(the three as canonical JSON text). Entries form one chain: ``seq`` counts 1, 2, 3, ... with no
gap, and each entry's ``hash`` is the SHA-256 of the canonical JSON of its fields together with
``prev_hash``, the hash of the entry before it (:data:`GENESIS` for the first). Changing, removing,
reordering or inserting an entry therefore breaks the chain at that entry or the one after it;
:class:`ChainVerifier` finds the first place where it breaks, streamed in ``seq`` order.

The chain's **head** (the last entry's seq and hash) is also kept apart from the entries (in
the graph, written with every append), so that removing the newest entries shows too. What a
hash chain cannot show: someone who rewrites every entry from the altered one onwards *and*
the head. Against that, keep a copy of a head (``slicesched audit verify`` prints it) and check
later that the chain still passes through it (``--anchor SEQ:HASH``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GENESIS = "0" * 64  # the prev_hash of entry 1
FIELDS = ("seq", "at", "actor", "actor_role", "action", "target_kind", "target_id", "tenant_id",
          "before", "after", "details", "prev_hash", "hash")  # as stored, as read back (rows in this order)
_HASHED = FIELDS[:-2]  # with prev_hash, what an entry's hash covers


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acted: a principal's id and role (``admin``, ``tenant``, ``executor``; the service's own
    ``scheduler`` and ``system``; later roles are more strings)."""

    actor_id: str
    role: str


SCHEDULER = Actor("scheduler", "scheduler")  # placement decisions and re-plans
SYSTEM = Actor("service", "system")  # what the service does on its own: start, dropping silent executors


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples and sets as lists, non-finite floats and anything
    else unknown as text (the audit log must take every figure a decision carries)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(plain(v) for v in value)
    return str(value)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8 as is (what is hashed and stored)."""
    return _CANONICAL.encode(value)


def json_text(value: Any) -> str | None:
    """``before``, ``after`` and ``details`` as stored: canonical JSON, ``None`` for nothing."""
    return None if value is None else canonical_json(plain(value))


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An entry before it has its place in the chain (what :meth:`chained` turns into an entry)."""

    at: float  # epoch seconds of the action
    actor: str
    actor_role: str
    action: str  # dotted: tenant.create, tenant.key.rotate, placement.decision, ...
    target_kind: str
    target_id: str | None
    tenant_id: str | None  # None: a platform entry (admins only)
    before: str | None  # canonical JSON (json_text)
    after: str | None
    details: str | None

    def chained(self, seq: int, prev_hash: str) -> AuditEntry:
        fields: dict[str, Any] = {
            "seq": seq, "at": self.at, "actor": self.actor, "actor_role": self.actor_role, "action": self.action,
            "target_kind": self.target_kind, "target_id": self.target_id, "tenant_id": self.tenant_id,
            "before": self.before, "after": self.after, "details": self.details}
        return AuditEntry(**fields, prev_hash=prev_hash, hash=entry_hash(fields, prev_hash))


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    at: float
    actor: str
    actor_role: str
    action: str
    target_kind: str
    target_id: str | None
    tenant_id: str | None
    before: str | None
    after: str | None
    details: str | None
    prev_hash: str
    hash: str

    def row(self) -> dict[str, Any]:
        """The properties stored on the entry's node (a ``None`` is stored as no property)."""
        return {f: getattr(self, f) for f in FIELDS}

    def public(self) -> dict[str, Any]:
        """As the API shows it: before, after and details parsed back from their JSON."""
        out = self.row()
        for f in ("before", "after", "details"):
            out[f] = None if out[f] is None else json.loads(out[f])
        return out


def entry_hash(fields: Mapping[str, Any], prev_hash: str) -> str:
    """SHA-256 hex of the canonical JSON of the entry's fields (every one but ``hash``) with ``prev_hash``."""
    body = {f: fields.get(f) for f in _HASHED}
    body["prev_hash"] = prev_hash
    return hashlib.sha256(_CANONICAL.encode(body).encode()).hexdigest()



def chain(records: Iterable[AuditRecord], head_seq: int = 0, head_hash: str = GENESIS) -> list[AuditEntry]:
    """The records as the entries that follow the head ``(head_seq, head_hash)``, in order."""
    out = []
    for r in records:
        entry = r.chained(head_seq + 1, head_hash)
        out.append(entry)
        head_seq, head_hash = entry.seq, entry.hash
    return out


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    entries: int  # entries read (up to and including the first bad one)
    last_seq: int  # the last intact entry's seq (0: none)
    last_hash: str  # its hash (GENESIS: none)
    first_bad_seq: int | None = None
    reason: str | None = None
    start_seq: int = 0  # the chain was checked from after this seq (an archived prefix's last; 0: from genesis)

    def public(self) -> dict[str, Any]:
        return {"ok": self.ok, "entries": self.entries, "last_seq": self.last_seq, "last_hash": self.last_hash,
                "first_bad_seq": self.first_bad_seq, "reason": self.reason, "start_seq": self.start_seq}


class ChainVerifier:
    """Checks entries fed in ``seq`` order (as rows in :data:`FIELDS` order) against the chain's
    rules and stops at the first break: a gap in ``seq`` (removed entries), a ``hash`` that does
    not match the entry's fields (altered, or moved to another seq), a ``prev_hash`` that is not
    the hash of the entry before (inserted, reordered or removed before it). ``anchor``: a
    ``(seq, hash)`` recorded earlier that the chain must still pass through. ``start``: where the
    entries fed begin, the last ``(seq, hash)`` of a prefix archived and deleted (retention); the
    first entry fed must follow it, as entry 1 follows the genesis hash."""

    RECENT = 4096  # hashes of recent entries, to name the entry a bad link points to

    def __init__(self, anchor: tuple[int, str] | None = None, start: tuple[int, str] = (0, GENESIS)) -> None:
        self.anchor = anchor
        self.start_seq = start[0]
        self.entries = 0
        self.last_seq = start[0]
        self.last_hash = start[1]
        self.bad: tuple[int, str] | None = None
        self._recent: OrderedDict[str, int] = OrderedDict()

    def feed(self, rows: Iterable[list[Any]]) -> bool:
        """Check a page of rows; False once the chain is broken (the rest is not looked at)."""
        if self.bad is not None:
            return False
        for row in rows:
            fields = dict(zip(FIELDS, row, strict=True))
            seq = row[0]
            self.entries += 1
            why = self._check(seq, fields)
            if why is not None:
                self.bad = why
                return False
            self.last_seq, self.last_hash = seq, row[-1]
            self._recent[self.last_hash] = seq
            if len(self._recent) > self.RECENT:
                self._recent.popitem(last=False)
        return True

    def _check(self, seq: Any, fields: dict[str, Any]) -> tuple[int, str] | None:
        expected = self.last_seq + 1
        if not isinstance(seq, int) or isinstance(seq, bool):
            return expected, f"the entry after seq {self.last_seq} has no integer seq ({seq!r})"
        if seq < expected:
            return seq, f"seq {seq} appears again after seq {self.last_seq} (a duplicate or reordered entry)"
        if seq > expected:
            missing = f"entry {expected}" if seq == expected + 1 else f"entries {expected}-{seq - 1}"
            return expected, f"{missing} missing: seq {seq} follows seq {self.last_seq} (removed)"
        if fields["hash"] != entry_hash(fields, fields["prev_hash"]):
            return seq, "its hash does not match its fields (altered, or moved from another seq)"
        if fields["prev_hash"] != self.last_hash:
            if seq == 1:
                return seq, "the first entry does not start from the genesis hash (inserted before it)"
            if seq == self.start_seq + 1:
                return seq, f"its prev_hash is not the archived prefix's last hash (seq {self.start_seq})"
            points_to = self._recent.get(fields["prev_hash"])
            where = f"it links to entry {points_to}" if points_to is not None else "it links to no entry before it"
            return seq, f"its prev_hash is not the hash of entry {self.last_seq}: {where} (inserted or reordered)"
        if self.anchor is not None and seq == self.anchor[0] and fields["hash"] != self.anchor[1]:
            return seq, f"its hash differs from the anchor recorded for seq {seq} (the chain was rewritten)"
        return None

    def finish(self, head: tuple[int, str] | None) -> VerifyResult:
        """The outcome once every entry was fed; ``head``: the head stored apart from the entries
        (``None``: none stored), which must name the last entry."""
        if self.bad is None:
            self.bad = self._check_end(head)
        if self.bad is not None:
            return VerifyResult(False, self.entries, self.last_seq, self.last_hash, *self.bad, start_seq=self.start_seq)
        return VerifyResult(True, self.entries, self.last_seq, self.last_hash, start_seq=self.start_seq)

    def _check_end(self, head: tuple[int, str] | None) -> tuple[int, str] | None:
        if self.anchor is not None and self.anchor[0] <= self.start_seq:
            return self.start_seq + 1, f"the anchor's seq {self.anchor[0]} is in the archived prefix (through seq " \
                                       f"{self.start_seq}): check it against the archive"
        if self.anchor is not None and self.anchor[0] > self.last_seq:
            return self.last_seq + 1, f"the chain ends at seq {self.last_seq}, before the anchor's seq {self.anchor[0]}"
        head_seq, head_hash = head if head is not None else (0, GENESIS)
        if head_seq > self.last_seq:
            missing = f"entry {head_seq}" if head_seq == self.last_seq + 1 else f"entries {self.last_seq + 1}-{head_seq}"
            return self.last_seq + 1, f"{missing} missing: the chain ends at seq {self.last_seq} but its head is seq {head_seq}"
        if head_seq < self.last_seq:
            return head_seq + 1, f"the chain runs past its head (seq {head_seq}): entries after it were appended " \
                                 "outside the service"
        if head_hash != self.last_hash:
            return self.last_seq, f"the head's hash differs from entry {self.last_seq}'s (the head or the entry was rewritten)"
        return None
