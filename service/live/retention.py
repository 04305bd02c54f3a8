"""Retention: what the service keeps adding to (requests with their results, workflows with
their steps, audit entries, predictor observations) is archived, then deleted, once past its
retention (:class:`RetentionSettings`, from ``SLICESCHED_RETAIN_*``).

Each batch, for each kind: read a page of what is past its cutoff (oldest first, at most
``batch`` rows); write it to a gzipped NDJSON file (a temporary name, flushed to disk, then
renamed); read the file back and check it holds exactly those rows, in order (else nothing is
deleted); delete exactly those rows in one transaction, each checked against its cutoff again
(:mod:`service.graph.retention_store`). A crash between the archive and the delete leaves the
rows in both places and the next run archives them again: an archive may hold a row twice, it
never misses one. A failure at any step raises; under the service it is a failed tick of the
supervised ``retention`` loop (logged, counted, retried on the next tick), never a loop that
died.

The audit log is a hash chain, so only a prefix of it goes: entries in seq order up to the first
one inside the retention, never the newest (the chain's head stays an entry). Before the prefix
is archived it is verified from where the kept chain starts (a broken chain is left in place,
with the error); its deletion and the move of the ``AuditArchive`` node to its last entry's
seq and hash are one transaction, and verification (``slicesched audit verify``) starts from
there. The archive files themselves verify from the genesis hash (:func:`verify_audit_archive`).

Observations live in a file the service appends to; they are rewritten under a lock file that
the appender takes too (:func:`observations_lock`), so no line written meanwhile is lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service import environment as env
from service.domain.audit import FIELDS, GENESIS, ChainVerifier, VerifyResult
from service.domain.error import InvalidInputError, InvariantError

if TYPE_CHECKING:
    from service.graph.repository import GraphRepository

log = logging.getLogger("slicesched.retention")

KINDS = ("requests", "workflows", "audit", "observations")
MAX_BATCHES = 10_000  # per kind and pass: a pass that finds rows it cannot delete still ends


class ArchiveError(InvariantError):
    """An archive that cannot be written or read back as written (nothing was deleted)."""


@dataclass(frozen=True)
class RetentionSettings:
    requests_s: float = 7 * 86400.0  # finished requests, after they finished
    workflows_s: float = 7 * 86400.0  # ended workflows, after they ended
    audit_s: float = 90 * 86400.0  # audit entries, after they were recorded
    observations_s: float = 30 * 86400.0  # predictor observations, after they were made
    interval_s: float = 600.0  # the service runs a pass this often
    batch: int = 5000  # rows per page, archive file and delete transaction
    archive_dir: Path | None = None  # None: <state>/archive

    def __post_init__(self) -> None:
        for name in ("requests_s", "workflows_s", "audit_s", "observations_s", "interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise InvalidInputError(f"retention {name} must be > 0 (a retention of zero would delete what was "
                                        f"just written), got {value}", culprit=name)
        if not 1 <= self.batch <= 100_000:
            raise InvalidInputError(f"retention batch must be in [1, 100000], got {self.batch}", culprit="batch")

    @staticmethod
    def from_env() -> RetentionSettings:
        """From ``SLICESCHED_RETAIN_*``, ``SLICESCHED_RETENTION_*`` and ``SLICESCHED_ARCHIVE_DIR``
        (a malformed value, or a retention of zero, is refused naming its variable)."""
        state = env.path("SLICESCHED_STATE") or Path.home() / ".local/state/slicesched"
        return RetentionSettings(
            requests_s=env.number("SLICESCHED_RETAIN_REQUESTS_S", float),
            workflows_s=env.number("SLICESCHED_RETAIN_WORKFLOWS_S", float),
            audit_s=env.number("SLICESCHED_RETAIN_AUDIT_S", float),
            observations_s=env.number("SLICESCHED_RETAIN_OBSERVATIONS_S", float),
            interval_s=env.number("SLICESCHED_RETENTION_INTERVAL_S", float),
            batch=env.number("SLICESCHED_RETENTION_BATCH", int),
            archive_dir=env.path("SLICESCHED_ARCHIVE_DIR") or state / "archive")

    def cutoffs(self, now: float) -> dict[str, float]:
        """Per kind, the epoch second before which rows are past their retention."""
        return {"requests": now - self.requests_s, "workflows": now - self.workflows_s, "audit": now - self.audit_s,
                "observations": now - self.observations_s}


# ---- archive files ------------------------------------------------------------------------------------
def write_archive(directory: Path, kind: str, rows: list[dict[str, Any]], key: str) -> Path:
    """``rows`` as ``<directory>/<kind>/<kind>-<UTC time>-<id>.ndjson.gz`` (one JSON object a line),
    written under a temporary name, flushed to disk and renamed, then read back: the file must
    hold the rows' ``key`` values in order, else :class:`ArchiveError` (and the caller deletes
    nothing)."""
    folder = directory / kind
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}.ndjson.gz"
    part = path.with_name(path.name + ".part")
    with gzip.open(part, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str) + "\n")
    with part.open("rb") as raw:
        os.fsync(raw.fileno())
    part.replace(path)
    with contextlib.suppress(OSError):  # the rename durable too (not every filesystem lets a folder be synced)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    back = read_archive(path)
    if [r.get(key) for r in back] != [r.get(key) for r in rows]:
        raise ArchiveError(f"{path} does not read back as written ({len(back)} of {len(rows)} rows): nothing deleted")
    return path


def read_archive(path: Path) -> list[dict[str, Any]]:
    """The rows of an archive file (:class:`ArchiveError` when it cannot be read whole)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, ValueError) as exc:
        raise ArchiveError(f"archive {path} cannot be read: {type(exc).__name__}: {exc}") from None


def verify_audit_archive(files: Sequence[str | Path], start: tuple[int, str] = (0, GENESIS)) -> VerifyResult:
    """The audit entries archived in ``files`` (in the order retention wrote them, as the
    ``AuditArchive`` node lists them) checked as a chain from ``start`` (the genesis hash)."""
    verifier = ChainVerifier(start=start)
    for f in files:
        if not verifier.feed([[row.get(k) for k in FIELDS] for row in read_archive(Path(f))]):
            break
    return verifier.finish((verifier.last_seq, verifier.last_hash) if verifier.bad is None else None)


@contextlib.contextmanager
def observations_lock(path: Path) -> Iterator[None]:
    """Held while the observations file at ``path`` is appended to or rewritten (a lock file
    beside it: the service's appender and a retention run, in any process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


# ---- the passes -------------------------------------------------------------------------------------------
@dataclass
class KindReport:
    archived: int = 0
    deleted: int = 0
    files: list[str] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        return {"archived": self.archived, "deleted": self.deleted, "files": list(self.files)}


class Retention:
    """Archive-then-delete for each kind (module docstring). ``repo`` holds requests, workflows
    and the audit log; ``observations``: the predictor's observations file (None: none)."""

    def __init__(self, repo: GraphRepository, settings: RetentionSettings, *, observations: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if settings.archive_dir is None:
            raise InvalidInputError("retention needs an archive folder (SLICESCHED_ARCHIVE_DIR)")
        self.repo = repo
        self.settings = settings
        self.archive_dir = settings.archive_dir
        self.observations = observations
        self.clock = clock
        self.totals = {k: KindReport() for k in KINDS}  # since this object was made (the service's metrics)

    # ---- one batch each (blocking: the service runs them in a worker thread) ----------------------------
    def requests_batch(self, now: float) -> KindReport:
        cutoff = self.settings.cutoffs(now)["requests"]
        rows = self.repo.retention.retention_requests_page(cutoff, self.settings.batch)
        return self._archive_then_delete("requests", rows, lambda uids: self.repo.retention.retention_delete_requests(uids, cutoff))

    def workflows_batch(self, now: float) -> KindReport:
        cutoff = self.settings.cutoffs(now)["workflows"]
        rows = self.repo.retention.retention_workflows_page(cutoff, self.settings.batch)
        return self._archive_then_delete("workflows", rows,
                                         lambda uids: self.repo.retention.retention_delete_workflows(uids, cutoff))

    def _archive_then_delete(self, kind: str, rows: list[dict[str, Any]], delete: Callable[[list[str]], int]
                             ) -> KindReport:
        out = KindReport()
        if not rows:
            return out
        path = write_archive(self.archive_dir, kind, rows, "uid")
        out.archived, out.files = len(rows), [str(path)]
        out.deleted = delete([str(r["uid"]) for r in rows])
        self._add(kind, out)
        return out

    def audit_batch(self, now: float) -> KindReport:
        """The next prefix of the chain past its retention (never the head entry): verified from
        where the kept chain starts, archived, then deleted with the archive's start moved."""
        out = KindReport()
        cutoff = self.settings.cutoffs(now)["audit"]
        after_seq, after_hash, _ = self.repo.audit.audit_archive()
        head = self.repo.audit.audit_head()
        if head["head_seq"] is None:
            return out
        prefix = []
        for row in self.repo.audit.audit_page(after_seq, self.settings.batch):
            if row[0] >= int(head["head_seq"]) or not float(row[1]) < cutoff:
                break
            prefix.append(row)
        if not prefix:
            return out
        verifier = ChainVerifier(start=(after_seq, after_hash))
        if not verifier.feed(prefix):
            assert verifier.bad is not None
            raise ArchiveError(f"the audit chain is broken at seq {verifier.bad[0]} ({verifier.bad[1]}): nothing "
                               "archived or deleted; run 'slicesched audit verify'")
        path = write_archive(self.archive_dir, "audit", [dict(zip(FIELDS, row, strict=True)) for row in prefix], "seq")
        deleted = self.repo.retention.retention_delete_audit_prefix(after_seq, (prefix[-1][0], prefix[-1][-1]), str(path), now)
        if deleted is None:
            raise ArchiveError(f"the audit archive moved past seq {after_seq} during this batch (another retention "
                               f"run?): {path} holds entries that stay in the graph")
        out.archived, out.deleted, out.files = len(prefix), deleted, [str(path)]
        self._add("audit", out)
        return out

    def observations_pass(self, now: float) -> KindReport:
        """Observations older than their retention, out of the file (and its rotated
        generation): archived, then the file rewritten without them, under the appender's lock."""
        out = KindReport()
        if self.observations is None:
            return out
        cutoff = self.settings.cutoffs(now)["observations"]
        with observations_lock(self.observations):
            for path in (self.observations.with_name(self.observations.name + ".1"), self.observations):
                if not path.is_file():
                    continue
                old: list[str] = []
                kept: list[str] = []
                for line in path.read_text().splitlines(keepends=True):
                    at = _at(line)
                    (old if at is not None and at < cutoff else kept).append(line)
                if not old:
                    continue
                rows = [json.loads(line) for line in old]
                for i, row in enumerate(rows):
                    row["_line"] = i
                archive = write_archive(self.archive_dir, "observations", rows, "_line")
                part = path.with_name(path.name + ".part")
                part.write_text("".join(kept))
                part.replace(path)
                out.archived += len(old)
                out.deleted += len(old)
                out.files.append(str(archive))
        self._add("observations", out)
        return out

    def _add(self, kind: str, part: KindReport) -> None:
        total = self.totals[kind]
        total.archived += part.archived
        total.deleted += part.deleted
        total.files = (total.files + part.files)[-20:]

    # ---- passes ------------------------------------------------------------------------------------------
    def batches(self) -> dict[str, Callable[[float], KindReport]]:
        return {"requests": self.requests_batch, "workflows": self.workflows_batch, "audit": self.audit_batch,
                "observations": self.observations_pass}

    def run(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """One whole pass, blocking (``slicesched retention run``): every kind until nothing past
        its retention is left."""
        now = self.clock() if now is None else now
        report: dict[str, dict[str, Any]] = {}
        for kind, batch in self.batches().items():
            total = KindReport()
            for _ in range(MAX_BATCHES):
                part = batch(now)
                total.archived += part.archived
                total.deleted += part.deleted
                total.files += part.files
                if not self._more(kind, part):
                    break
            report[kind] = total.public()
        return report

    async def tick(self, call: Callable[..., Awaitable[Any]]) -> dict[str, dict[str, Any]]:
        """One pass under the service's supervisor: each batch is one ``call(fn, now)`` (the
        service's bounded Neo4j call, in a worker thread), so other calls interleave between
        batches; a failure raises to the supervisor (logged, counted, the next tick retries)."""
        now = self.clock()
        report: dict[str, dict[str, Any]] = {}
        for kind, batch in self.batches().items():
            total = KindReport()
            for _ in range(MAX_BATCHES):
                part: KindReport = await call(batch, now)
                total.archived += part.archived
                total.deleted += part.deleted
                if not self._more(kind, part):
                    break
            if total.deleted:
                log.info("retention: %s: %d archived, %d deleted", kind, total.archived, total.deleted)
            report[kind] = total.public()
        return report

    def _more(self, kind: str, part: KindReport) -> bool:
        """Whether another batch may find more: a full page was archived and deleted."""
        return kind != "observations" and part.archived >= self.settings.batch and part.deleted > 0

    def plan(self, now: float | None = None) -> dict[str, Any]:
        """What a pass would archive and delete now, per kind (nothing is changed)."""
        now = self.clock() if now is None else now
        cut = self.settings.cutoffs(now)
        counts = self.repo.retention.retention_counts(cut["requests"], cut["workflows"], cut["audit"])
        through, _, files = self.repo.audit.audit_archive()
        observations = 0
        if self.observations is not None:
            for path in (self.observations.with_name(self.observations.name + ".1"), self.observations):
                if path.is_file():
                    observations += sum(1 for line in path.read_text().splitlines()
                                        if (at := _at(line)) is not None and at < cut["observations"])
        return {"now": now, "cutoffs": cut, "requests": counts["requests"], "workflows": counts["workflows"],
                "audit_entries": counts["audit_entries"], "observations": observations,
                "audit_archived_through_seq": through, "audit_archive_files": len(files),
                "archive_dir": str(self.archive_dir)}


def _at(line: str) -> float | None:
    """An observation line's ``at`` (epoch s); None for a line that has none (kept)."""
    try:
        at = json.loads(line).get("at")
    except (ValueError, AttributeError):
        return None
    return float(at) if isinstance(at, int | float) else None
