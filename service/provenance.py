"""Where a run came from: the code version it ran and the SHA-256 of the files it read.

Never fails a run: without git (not installed, or the code is not in a checkout) the code
version is the installed package version with no commit.
"""

from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata, resources
from pathlib import Path

from service.domain.experiment import CodeVersion

ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) holding service/
_GIT_TIMEOUT_S = 10.0


def _git(*args: str) -> str | None:
    """``git -C ROOT args`` stdout, or None when git is missing, fails or takes too long."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=True,
                              timeout=_GIT_TIMEOUT_S)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode("utf-8", "replace")


def package_version() -> str:
    try:
        return metadata.version("slicesched")
    except metadata.PackageNotFoundError:
        return "unknown"


def code_version() -> CodeVersion:
    """The git HEAD of the checkout holding this code, whether tracked files differ from it
    (untracked files are not counted: they are outputs more often than code) and the SHA-256
    of ``git diff HEAD``; the package version alone outside a checkout."""
    version = package_version()
    top = _git("rev-parse", "--show-toplevel")
    # the code's own checkout only: an installed copy inside some other repository is not it
    if top is None or Path(top.strip()).resolve() != ROOT:
        return CodeVersion(None, None, version)
    head = _git("rev-parse", "--verify", "HEAD")
    if head is None:
        return CodeVersion(None, None, version)
    status = _git("status", "--porcelain", "--untracked-files=no")
    if status is None:
        return CodeVersion(head.strip(), None, version)
    dirty = bool(status.strip())
    diff = _git("diff", "HEAD", "--binary") if dirty else None
    return CodeVersion(head.strip(), dirty, version,
                       hashlib.sha256(diff.encode()).hexdigest() if diff is not None else None)


def file_sha256(path: Path) -> str:
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_sha256(folder: Path) -> str:
    """SHA-256 over a folder's files (relative names and contents, sorted by name)."""
    h = hashlib.sha256()
    for p in sorted(x for x in Path(folder).rglob("*") if x.is_file()):
        h.update(str(p.relative_to(folder)).encode() + b"\0" + file_sha256(p).encode())
    return h.hexdigest()


def path_sha256(path: Path) -> str:
    """A file's SHA-256, or a folder's :func:`tree_sha256`."""
    return tree_sha256(path) if Path(path).is_dir() else file_sha256(path)


def builtin_sha256(package: str, folder: str, name: str) -> str:
    """SHA-256 of a built-in YAML document (a cluster spec, a tenant mix) shipped with the code."""
    return hashlib.sha256((resources.files(package) / folder / f"{name}.yaml").read_bytes()).hexdigest()
