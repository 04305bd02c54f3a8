"""Where the public data is read from: ``$SLICESCHED_DATA``, then ``../shared/data``.

Two data folders, looked in in this order:

1. the cache, ``$SLICESCHED_DATA`` (default ``$XDG_CACHE_HOME/slicesched/data``, else
   ``~/.cache/slicesched/data``): where ``slicesched data fetch`` puts what it downloads;
2. ``../shared/data`` beside the project's folder (a copy kept next to the clone, as in CI).

A relative data path (``azure-llm-2023/AzureLLMInferenceTrace_code.csv``) is found in the first
folder that has it; a folder that holds manifest files is found in the first data folder that
has all of them, so a fetch cut short in the cache never hides a complete copy beside the
project. Nothing here reads a file's bytes: checksums are :mod:`service.data.fetch`'s business.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from service import environment as env
from service.data.manifest import Manifest, load_manifest
from service.domain.error import InvalidInputError

CACHE_ENV = "SLICESCHED_DATA"
MIRROR_ENV = "SLICESCHED_DATA_MIRROR"  # the CLI's default --mirror (service.data.fetch)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class DataMissingError(InvalidInputError):
    """A data path found in no data folder (exit code 2); the message says how to get it."""


def fetch_hint(*names: str) -> str:
    """What to do about absent data sets, in one line (also a skipped test's reason)."""
    which = f"data set {names[0]!r} is" if len(names) == 1 else f"data sets {', '.join(map(repr, names))} are"
    return f"{which} absent: run `slicesched data fetch {' '.join(names)}`"


def default_cache_dir() -> Path:
    """``$SLICESCHED_DATA``, else ``$XDG_CACHE_HOME/slicesched/data``, else ``~/.cache/slicesched/data``."""
    given = env.path(CACHE_ENV)
    if given is not None:
        return given
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "slicesched" / "data"


@dataclass(frozen=True)
class DataRoots:
    """The data folders in lookup order: ``cache`` (fetch's target) first, then ``shared``."""

    cache: Path
    shared: Path

    @classmethod
    def from_env(cls) -> DataRoots:
        return cls(default_cache_dir(), PROJECT_ROOT.parent / "shared" / "data")

    @property
    def folders(self) -> tuple[Path, Path]:
        return self.cache, self.shared


def find(rel: str | PurePosixPath, *, roots: DataRoots | None = None, manifest: Manifest | None = None) -> Path | None:
    """The first data folder's copy of ``rel`` (a file, or a folder with all its manifest files), or None."""
    roots = roots or DataRoots.from_env()
    rel = PurePosixPath(rel)
    # a folder of the manifest counts where all of its files are; anything else where it exists
    inside = [f.path for f in (manifest or load_manifest()).files_under(rel) if f.path != rel.as_posix()]
    for folder in roots.folders:
        if inside and all((folder / p).is_file() for p in inside):
            return folder / rel
        if not inside and (folder / rel).exists():
            return folder / rel
    return None


def resolve(rel: str | PurePosixPath, *, roots: DataRoots | None = None, manifest: Manifest | None = None) -> Path:
    """:func:`find`, or a :class:`DataMissingError` naming the data set and the fetch command."""
    roots = roots or DataRoots.from_env()
    manifest = manifest or load_manifest()
    found = find(rel, roots=roots, manifest=manifest)
    if found is not None:
        return found
    owner = manifest.owner(rel)
    if owner is None:
        raise DataMissingError(f"{rel} is in neither data folder ({roots.cache}, {roots.shared}; set {CACHE_ENV} "
                               "or give an absolute path)", culprit=str(rel))
    name = owner.name
    raise DataMissingError(f"data set {name!r} is absent ({rel} is in neither {roots.cache} nor {roots.shared}): "
                           f"run `slicesched data fetch {name}`", culprit=str(rel))


def locate(rel: str | PurePosixPath, *, roots: DataRoots | None = None) -> Path:
    """:func:`find`, else where ``slicesched data fetch`` would put it (in the cache): a path
    for a reader that reports a missing file itself."""
    roots = roots or DataRoots.from_env()
    return find(rel, roots=roots) or roots.cache / PurePosixPath(rel)


def is_present(name: str, *, roots: DataRoots | None = None, manifest: Manifest | None = None) -> bool:
    """Whether one data folder holds every file of data set ``name`` (by name, not checksum)."""
    manifest = manifest or load_manifest()
    manifest.dataset(name)
    return find(name, roots=roots, manifest=manifest) is not None
