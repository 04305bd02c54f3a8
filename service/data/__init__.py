"""The public data the project reads: its manifest, where it is found, fetching and checking it.

Readers call :func:`resolve` (or :func:`locate`) with a path relative to the data folder; it
looks in ``$SLICESCHED_DATA`` (default ``~/.cache/slicesched/data``), then in
``../shared/data`` beside the project. :func:`service.data.fetch.fetch` downloads data sets into
the first and verifies them (imported from its module: it brings httpx, which readers do not
need); :func:`list_files` reports each file present, missing or corrupt.
"""

from service.data.inventory import FileStatus, list_files
from service.data.location import DataMissingError, DataRoots, fetch_hint, find, is_present, locate, resolve
from service.data.manifest import DataFile, DataSet, Manifest, UnknownDataSetError, load_manifest

__all__ = [
    "DataFile",
    "DataMissingError",
    "DataRoots",
    "DataSet",
    "FileStatus",
    "Manifest",
    "UnknownDataSetError",
    "fetch_hint",
    "find",
    "is_present",
    "list_files",
    "load_manifest",
    "locate",
    "resolve",
]
