"""The audit log in the GMG: ``(:AuditEntry)`` nodes chained by hash, in ``seq`` order, linked
``-[:CONCERNS]->`` to the tenants, models and executor pools they name, and one
``(:AuditHead {log})`` holding the last entry's seq and hash (written in the same transaction as
the entries). Entries are found in order through the unique ``seq`` index rather than a ``NEXT``
relationship: the hash chain already carries the order, a walk by index range needs no
traversal, and an append touches no earlier node (no lock on the previous entry).

What an entry means and how its hash is made: :mod:`service.domain.audit`. Who appends:
:class:`service.live.audit.AuditLog` (one writer per process; the uniqueness of ``seq`` refuses a
second writer's entry for a seq already taken, and that writer re-chains after the head).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import neo4j
from neo4j import ManagedTransaction

from service.domain.audit import GENESIS, ChainVerifier, VerifyResult
from service.graph.store import StorePart

AUDIT_LOG = "audit"  # the AuditHead's name (one log today)
PAGE = 20_000  # entries per page when walking the chain


class AuditStore(StorePart):
    QUERIES: tuple[str, ...] = ("append_audit_entries", "set_audit_head", "audit_head", "audit_page", "audit_log",
                                "audit_archive")

    def append_audit_entries(self, rows: Sequence[dict[str, Any]], head: tuple[int, str]) -> int:
        """Append chained entries (``rows`` as :data:`append_audit_entries` takes them, in seq
        order) and move the head to ``head`` in one transaction; all or none. A seq already
        taken raises ``neo4j.exceptions.ConstraintError`` and writes nothing."""
        def work(tx: ManagedTransaction) -> int:
            out = self._tx_run(tx, "append_audit_entries", rows=list(rows))
            self._tx_run(tx, "set_audit_head", log=AUDIT_LOG, seq=head[0], hash=head[1])
            return int(out[0]["appended"]) if out else 0

        if not rows:
            return 0
        return self._execute_write(work)

    def audit_head(self) -> dict[str, Any]:
        """``head_seq``, ``head_hash`` (the stored head) and ``last_seq``, ``last_hash`` (the
        highest entry); each None when there is none."""
        rows = self._read("audit_head", log=AUDIT_LOG)
        return rows[0] if rows else {"head_seq": None, "head_hash": None, "last_seq": None, "last_hash": None}

    def audit_page(self, after_seq: int, limit: int = PAGE) -> list[list[Any]]:
        """Up to ``limit`` entries after ``after_seq``, in seq order, each as a list of
        :data:`service.domain.audit.FIELDS`."""
        q, params = self._q("audit_page", {"after_seq": int(after_seq), "limit": int(limit)})

        def work(tx: ManagedTransaction) -> list[list[Any]]:
            record = tx.run(q.text, params).single()  # the page as it came (Record.data() would copy it again)
            return list(record["page"]) if record is not None else []

        with self.driver.session(database=self.database, default_access_mode=neo4j.READ_ACCESS) as s:
            return s.execute_read(work)

    def audit_archive(self) -> tuple[int, str, list[str]]:
        """Where the chain kept in the graph starts: the last ``(seq, hash)`` of the prefix that
        retention archived and deleted (:mod:`service.live.retention`), and the archive files
        holding it; ``(0, GENESIS, [])`` when nothing was archived."""
        rows = self._read("audit_archive", log=AUDIT_LOG)
        row = rows[0] if rows else {}
        if row.get("through_seq") is None:
            return 0, GENESIS, []
        return int(row["through_seq"]), str(row["through_hash"]), [str(f) for f in row.get("files") or []]

    def audit_log(self, *, tenant_id: str | None = None, action: str | None = None, actor: str | None = None,
                  target_id: str | None = None, since_seq: int | None = None, until_seq: int | None = None,
                  since_at: float | None = None, until_at: float | None = None, limit: int = 100
                  ) -> list[dict[str, Any]]:
        """Entries matching every filter given, oldest first (the named query ``audit_log``)."""
        filters = {"action": action, "actor": actor, "target_id": target_id, "since_seq": since_seq,
                   "until_seq": until_seq, "since_at": since_at, "until_at": until_at}
        return self._read("audit_log", tenant_id=tenant_id, filters=filters, limit=int(limit))

    def iter_audit_pages(self, page: int = PAGE, *, after: int = -1) -> Iterator[list[list[Any]]]:
        """The chain in seq order (entries after seq ``after``), a page at a time. The next page
        is read in a thread while the caller checks the current one (the server's work overlaps
        the hashing)."""
        pages: queue.Queue[list[list[Any]] | BaseException | None] = queue.Queue(maxsize=2)
        stop = threading.Event()

        def read() -> None:
            last = after
            try:
                while not stop.is_set():
                    rows = self.audit_page(last, page)
                    if not rows:
                        break
                    pages.put(rows)
                    last = rows[-1][0]
            except BaseException as exc:  # handed to the consumer, raised there
                pages.put(exc)
                return
            pages.put(None)

        reader = threading.Thread(target=read, name="audit-reader", daemon=True)
        reader.start()
        try:
            while True:
                item = pages.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while reader.is_alive():  # unblock a reader waiting to put a page
                with contextlib.suppress(queue.Empty):
                    pages.get(timeout=0.05)

    def verify_audit(self, *, anchor: tuple[int, str] | None = None, page: int = PAGE,
                     progress: Callable[[int, float], None] | None = None) -> VerifyResult:
        """Walk the chain in seq order, recompute every hash and check every link, the stored
        head and ``anchor``: the first bad entry and why, or ok. The walk starts where the kept
        chain starts: after the archived prefix's last entry (:meth:`audit_archive`), whose hash
        the first kept entry must link to. ``progress(entries, seconds)`` is called after each page."""
        start_seq, start_hash, _ = self.audit_archive()
        verifier = ChainVerifier(anchor, (start_seq, start_hash))
        started = time.perf_counter()
        for rows in self.iter_audit_pages(page, after=start_seq):
            intact = verifier.feed(rows)
            if progress is not None:
                progress(verifier.entries, time.perf_counter() - started)
            if not intact:
                break
        while True:  # entries appended while the walk ran are behind a newer head: walk on to it
            head = self.audit_head()
            stored = (int(head["head_seq"]), str(head["head_hash"])) if head["head_seq"] is not None else None
            if verifier.bad is not None or stored is None or stored[0] <= verifier.last_seq:
                break
            rows = self.audit_page(verifier.last_seq, page)
            if not rows:
                break
            verifier.feed(rows)
        return verifier.finish(stored)
