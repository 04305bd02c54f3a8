"""``fetch``: download the manifest's data sets into the cache (``$SLICESCHED_DATA``) and verify them.

Per file: a copy already in the cache with the manifest's size and SHA-256 is kept; otherwise the
file is streamed (httpx for ``http(s)://``, the file system for ``file://``) into a hidden
temporary file beside its target, hashed while it arrives, checked against the manifest's size
and SHA-256, and renamed into place (atomic on one file system). A download that fails or does
not match is deleted, with any folder it created, so an interrupted or refused fetch leaves
nothing partial behind, and running fetch again completes it.

A mirror (``mirror=``, the CLI's ``--mirror`` / ``$SLICESCHED_DATA_MIRROR``) replaces the
upstream URLs: it holds the files at their data-folder paths (``<mirror>/<path>``), so any data
folder (``file:///path/to/data``, or one served over HTTP) is a mirror.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit
from urllib.request import url2pathname

import httpx

from service.data.inventory import mismatch
from service.data.location import DataRoots
from service.data.manifest import DataFile, Manifest, load_manifest
from service.domain.error import InvalidInputError, SliceschedError

_CHUNK_BYTES = 1 << 16
_TIMEOUT = httpx.Timeout(60.0, connect=15.0)


class DataFetchError(SliceschedError):
    """A download that failed or did not match the manifest (exit code 1); nothing was kept."""


@dataclass(frozen=True)
class FetchEvent:
    """Progress: ``file`` (``index`` of ``total``) is ``downloading`` from ``url``, or ended
    ``present`` (a verified copy was already in the cache) or ``downloaded``."""

    file: DataFile
    state: Literal["downloading", "downloaded", "present"]
    index: int
    total: int
    url: str


def source_url(f: DataFile, mirror: str | None) -> str:
    """Where ``f`` is downloaded from: upstream, or ``<mirror>/<its data-folder path>``."""
    return f.url if not mirror else f"{mirror.rstrip('/')}/{quote(f.path)}"


def check_mirror(mirror: str) -> str:
    if urlsplit(mirror).scheme not in ("http", "https", "file"):
        raise InvalidInputError(f"mirror {mirror!r}: expected an http://, https:// or file:// URL", culprit=mirror)
    return mirror


def fetch(names: Sequence[str] = (), *, mirror: str | None = None,
          progress: Callable[[FetchEvent], None] | None = None, roots: DataRoots | None = None,
          manifest: Manifest | None = None, client: httpx.Client | None = None) -> list[FetchEvent]:
    """Make the named data sets (all when none) present and verified in ``roots.cache``.

    Returns one final event per file (``present`` or ``downloaded``). Raises
    :class:`~service.data.manifest.UnknownDataSetError` for an unknown name (before anything is
    downloaded) and :class:`DataFetchError` at the first file that cannot be downloaded or does
    not match (files finished before it stay, verified).
    """
    roots = roots or DataRoots.from_env()
    files = [f for d in (manifest or load_manifest()).select(names) for f in d.files]
    if mirror:
        check_mirror(mirror)
    done: list[FetchEvent] = []
    with ExitStack() as stack:
        for i, f in enumerate(files, start=1):
            url = source_url(f, mirror)
            target = roots.cache / f.path
            if target.is_file() and mismatch(target, f) is None:
                event = FetchEvent(f, "present", i, len(files), url)
            else:
                if progress:
                    progress(FetchEvent(f, "downloading", i, len(files), url))
                if client is None and not url.startswith("file:"):
                    client = stack.enter_context(httpx.Client(timeout=_TIMEOUT, follow_redirects=True))
                _download(f, url, target, client)
                event = FetchEvent(f, "downloaded", i, len(files), url)
            if progress:
                progress(event)
            done.append(event)
    return done


def _download(f: DataFile, url: str, target: Path, client: httpx.Client | None) -> None:
    """Stream ``url`` into ``target`` through a verified temporary file (see the module doc)."""
    created = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    kept = False
    try:
        h, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for chunk in _chunks(url, f, client):
                size += len(chunk)
                if size > f.size_bytes:  # never store more than the manifest promises
                    raise DataFetchError(f"{f.path}: {url} sent more than the manifest's {f.size_bytes} bytes "
                                         f"(expected sha256 {f.sha256}); nothing was kept")
                h.update(chunk)
                out.write(chunk)
        if size != f.size_bytes or h.hexdigest() != f.sha256:
            raise DataFetchError(f"{f.path}: the download from {url} does not match the manifest: expected sha256 "
                                 f"{f.sha256} ({f.size_bytes} bytes), got sha256 {h.hexdigest()} ({size} bytes); "
                                 "nothing was kept")
        os.replace(tmp, target)
        kept = True
    finally:
        if not kept:
            tmp.unlink(missing_ok=True)
            for folder in created:  # deepest first; only those still empty
                try:
                    folder.rmdir()
                except OSError:
                    break


def _chunks(url: str, f: DataFile, client: httpx.Client | None) -> Iterator[bytes]:
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise DataFetchError(f"{f.path}: {url}: a file:// URL must name a local path")
        path = Path(url2pathname(unquote(parts.path)))
        try:
            with path.open("rb") as src:
                yield from iter(lambda: src.read(_CHUNK_BYTES), b"")
        except OSError as exc:
            raise DataFetchError(f"{f.path}: cannot read {url}: {exc.strerror or exc}") from None
        return
    assert client is not None  # fetch() opens one for every non-file URL
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise DataFetchError(f"{f.path}: {url} answered HTTP {response.status_code}")
            yield from response.iter_bytes(_CHUNK_BYTES)
    except httpx.HTTPError as exc:
        raise DataFetchError(f"{f.path}: cannot download {url}: {type(exc).__name__}: {exc}") from None
