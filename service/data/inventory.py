"""What of the manifest is where: each file present (size and SHA-256 as listed), missing or corrupt.

A file's status is that of the copy readers get, the one in the first data folder holding it
(:mod:`service.data.location`): a corrupt file in the cache is reported corrupt even where
``../shared/data`` has a good one, because readers would read the cache's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.data.location import DataRoots
from service.data.manifest import DataFile, Manifest, load_manifest

Status = Literal["present", "missing", "corrupt"]
_BLOCK_BYTES = 1 << 20


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_BLOCK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def mismatch(path: Path, f: DataFile) -> str | None:
    """None when ``path`` has the manifest's size and SHA-256, else what differs."""
    size = path.stat().st_size
    if size != f.size_bytes:
        return f"size {size} bytes, the manifest says {f.size_bytes}"
    digest = sha256_of(path)
    if digest != f.sha256:
        return f"sha256 {digest}, the manifest says {f.sha256}"
    return None


@dataclass(frozen=True)
class FileStatus:
    """One manifest file: its ``status``, the data folder readers find it in (None: missing)
    and, when corrupt, what differs."""

    file: DataFile
    status: Status
    folder: Path | None
    detail: str = ""


def file_status(f: DataFile, roots: DataRoots) -> FileStatus:
    for folder in roots.folders:
        path = folder / f.path
        if path.is_file():
            wrong = mismatch(path, f)
            return FileStatus(f, "corrupt" if wrong else "present", folder, wrong or "")
    return FileStatus(f, "missing", None)


def list_files(names: Sequence[str] = (), *, roots: DataRoots | None = None,
               manifest: Manifest | None = None) -> list[FileStatus]:
    """Every file of the named data sets (all when none), in manifest order, checked."""
    roots = roots or DataRoots.from_env()
    return [file_status(f, roots) for d in (manifest or load_manifest()).select(names) for f in d.files]
