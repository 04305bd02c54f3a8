"""Retention's reads and deletes in the GMG: pages of what is past its retention (the rows an
archive keeps), deletes of exactly the rows archived (each still checked against its cutoff, in
bounded batches: one ``UNWIND $uids`` per page), and the audit chain's archived prefix, deleted
in the same transaction that records where the kept chain starts (``AuditArchive``).

The policy (cutoffs, archives, the order of archive and delete) is
:mod:`service.live.retention`'s; this module only runs the catalog's queries."""

from __future__ import annotations

from typing import Any

from service.domain.audit import GENESIS
from service.graph.audit_store import AUDIT_LOG
from service.graph.store import StorePart


class RetentionStore(StorePart):
    QUERIES: tuple[str, ...] = ("retention_requests_page", "retention_delete_requests", "retention_workflows_page",
                                "retention_delete_workflows", "retention_delete_audit_prefix", "retention_counts")

    def retention_requests_page(self, before: float, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` finished requests that finished before ``before`` (epoch s), oldest first."""
        out = self._read("retention_requests_page", before=float(before), limit=int(limit))
        return list(out[0]["rows"]) if out else []

    def retention_delete_requests(self, uids: list[str], before: float) -> int:
        out = self._write("retention_delete_requests", uids=list(uids), before=float(before))
        return int(out[0]["deleted"]) if out else 0

    def retention_workflows_page(self, before: float, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` ended workflows that finished before ``before``, oldest first, each with
        its ``steps``."""
        out = self._read("retention_workflows_page", before=float(before), limit=int(limit))
        return list(out[0]["rows"]) if out else []

    def retention_delete_workflows(self, uids: list[str], before: float) -> int:
        out = self._write("retention_delete_workflows", uids=list(uids), before=float(before))
        return int(out[0]["deleted"]) if out else 0

    def retention_delete_audit_prefix(self, after_seq: int, through: tuple[int, str], file: str,
                                      archived_at: float) -> int | None:
        """Delete the entries after ``after_seq`` up to ``through``'s seq and move the archive's
        start to ``through``, in one transaction; None (nothing done) when the archive no longer
        stands at ``after_seq`` (another run moved it)."""
        out = self._write("retention_delete_audit_prefix", log=AUDIT_LOG, after_seq=int(after_seq),
                          through_seq=int(through[0]), through_hash=str(through[1]), genesis=GENESIS,
                          archived_at=float(archived_at), file=str(file))
        return int(out[0]["deleted"]) if out else None

    def retention_counts(self, requests_before: float, workflows_before: float, audit_before: float) -> dict[str, int]:
        """How many requests, workflows and audit entries are past their cutoffs."""
        out = self._read("retention_counts", requests_before=float(requests_before),
                         workflows_before=float(workflows_before), audit_before=float(audit_before))
        row = out[0] if out else {}
        return {k: int(row.get(k) or 0) for k in ("requests", "workflows", "audit_entries")}
