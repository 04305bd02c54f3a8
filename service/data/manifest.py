"""The manifest of the public data the project reads (``manifest.json`` beside this module).

A data set is one folder of the data folder (``azure-llm-2023/``, ``vidur-profiling/``, ...): its
description, license, source page, what in the project reads it, and its files. A file is named
by its path in the data folder (POSIX, starting with the data set's name), its upstream URL (raw
GitHub at a pinned commit), its SHA-256 and its size in bytes. Only files the project reads are
listed; the checksums are those of the copies in ``../shared/data`` (tests/unit/test_data.py
checks them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from service.domain.error import InvariantError, NotFoundError

MANIFEST_PATH = Path(__file__).with_name("manifest.json")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class UnknownDataSetError(NotFoundError):
    """A data set name the manifest does not hold (exit code 2); the message lists the names."""


@dataclass(frozen=True)
class DataFile:
    """One file of a data set. ``path`` is relative to the data folder; ``url`` is upstream."""

    dataset: str
    path: str
    url: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class DataSet:
    """One data set: a folder of the data folder named ``name``."""

    name: str
    description: str
    license: str
    source: str  # the upstream page that describes the data
    citation: str
    read_by: tuple[str, ...]  # what in the project reads it
    files: tuple[DataFile, ...]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


@dataclass(frozen=True)
class Manifest:
    datasets: tuple[DataSet, ...]

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.datasets]

    def dataset(self, name: str) -> DataSet:
        for d in self.datasets:
            if d.name == name:
                return d
        raise UnknownDataSetError(f"unknown data set {name!r}: the data sets are {', '.join(self.names)}")

    def select(self, names: Sequence[str]) -> list[DataSet]:
        """The named data sets in the order given (all of them when ``names`` is empty); an
        unknown name is an :class:`UnknownDataSetError` before anything is done."""
        return [self.dataset(n) for n in dict.fromkeys(names)] if names else list(self.datasets)

    def owner(self, rel: str | PurePosixPath) -> DataSet | None:
        """The data set a relative path lies in (its first component), or None."""
        parts = PurePosixPath(rel).parts
        return next((d for d in self.datasets if parts and parts[0] == d.name), None)

    def files_under(self, rel: str | PurePosixPath) -> list[DataFile]:
        """The manifest's files at ``rel`` or below it (``rel`` a file or a folder)."""
        prefix = PurePosixPath(rel).as_posix().rstrip("/")
        d = self.owner(prefix)
        if d is None:
            return []
        return [f for f in d.files if f.path == prefix or f.path.startswith(prefix + "/")]


def parse_manifest(doc: dict[str, Any], *, where: str = "manifest") -> Manifest:
    """A manifest from its JSON document; a malformed one is an :class:`InvariantError` (it ships
    with the code, so a bad one is a bug, not a user's input)."""
    try:
        datasets = []
        for d in doc["datasets"]:
            name = str(d["name"])
            files = tuple(DataFile(name, str(f["path"]), str(f["url"]), str(f["sha256"]), int(f["size_bytes"]))
                          for f in d["files"])
            datasets.append(DataSet(name, str(d["description"]), str(d["license"]), str(d["source"]),
                                    str(d["citation"]), tuple(str(r) for r in d["read_by"]), files))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvariantError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None
    for ds in datasets:
        for f in ds.files:
            rel = PurePosixPath(f.path)
            if rel.is_absolute() or ".." in rel.parts or rel.parts[0] != ds.name or len(rel.parts) < 2:
                raise InvariantError(f"{where}: {f.path!r} is not a path inside the data set folder {ds.name}/")
            if not _SHA256.match(f.sha256) or f.size_bytes < 0:
                raise InvariantError(f"{where}: {f.path}: sha256 must be 64 lowercase hex digits and size >= 0")
            if not f.url.startswith(("https://", "http://", "file://")):
                raise InvariantError(f"{where}: {f.path}: url {f.url!r} is not http(s) or file")
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise InvariantError(f"{where}: duplicate data set names in {names}")
    return Manifest(tuple(datasets))


@cache
def load_manifest(path: Path = MANIFEST_PATH) -> Manifest:
    """The project's manifest (read once per process)."""
    return parse_manifest(json.loads(path.read_text()), where=str(path))
