"""``slicesched data fetch [NAME...]`` and ``slicesched data list``: the public data the project reads.

``fetch`` downloads the named data sets (all when none) into ``$SLICESCHED_DATA`` and verifies
each file's size and SHA-256; an unknown name exits 2 with the list of names, a failed or
refused download exits 1 naming the file (and both digests on a mismatch). ``list`` shows each
data set, how many of its files are present, missing or corrupt, and the folder readers find
them in; ``--files`` adds a line per file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from service import environment as env
from service.data.inventory import FileStatus, list_files
from service.data.location import CACHE_ENV, MIRROR_ENV, DataRoots, find, is_present
from service.data.manifest import load_manifest
from service.harness.console import print_table

if TYPE_CHECKING:
    from service.data.fetch import FetchEvent


def add_parser(sub: Any) -> None:
    p = sub.add_parser("data", help="the public traces and profiles: fetch them into the cache, list what is where")
    actions = p.add_subparsers(dest="action", required=True)
    f = actions.add_parser("fetch", help=f"download data sets into ${CACHE_ENV} (default ~/.cache/slicesched/data) "
                                         "and verify their SHA-256")
    f.add_argument("names", nargs="*", metavar="NAME", help="data sets to fetch (default: all; see 'data list')")
    f.add_argument("--mirror", default=env.text(MIRROR_ENV),
                   help=f"base URL replacing the upstream URLs: files at <mirror>/<data path>, e.g. "
                        f"file:///path/to/data (default ${MIRROR_ENV})")
    f.add_argument("--missing", action="store_true",
                   help="only the data sets that no data folder holds yet (what `make test` and `make demo` run)")
    f.set_defaults(func=cmd_fetch)
    ls = actions.add_parser("list", help="each data set: files present, missing or corrupt, and where")
    ls.add_argument("names", nargs="*", metavar="NAME", help="data sets to list (default: all)")
    ls.add_argument("--files", action="store_true", help="a line per file")
    ls.add_argument("--json", action="store_true", help="print every file's status as JSON")
    ls.set_defaults(func=cmd_list)


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB" if num_bytes >= 100_000 else f"{num_bytes / 1e3:.1f} kB"


def _print_progress(event: FetchEvent) -> None:
    if event.state == "downloading":
        print(f"[{event.index}/{event.total}] {event.file.path} ({_size(event.file.size_bytes)}) from {event.url}",
              file=sys.stderr, flush=True)


def cmd_fetch(args: argparse.Namespace) -> int:
    from service.data.fetch import fetch  # httpx: only when fetching

    roots = DataRoots.from_env()
    manifest = load_manifest()
    datasets = manifest.select(args.names)  # an unknown name fails here, before any download
    if args.missing:
        held = [d for d in datasets if is_present(d.name, roots=roots, manifest=manifest)]
        for d in held:
            print(f"{d.name}: present in {find(d.name, roots=roots, manifest=manifest)}")
        datasets = [d for d in datasets if d not in held]
        if not datasets:
            return 0
    events = fetch([d.name for d in datasets], mirror=args.mirror, progress=_print_progress, roots=roots,
                   manifest=manifest)
    states = Counter((e.file.dataset, e.state) for e in events)
    for d in datasets:
        files = f"{len(d.files)} file" + ("s" if len(d.files) != 1 else "")
        print(f"{d.name}: {files}, {_size(d.size_bytes)} verified in {roots.cache / d.name} "
              f"({states[d.name, 'downloaded']} downloaded, {states[d.name, 'present']} already there)")
    return 0


def _where(statuses: list[FileStatus]) -> str:
    folders = sorted({str(s.folder) for s in statuses if s.folder is not None})
    return ", ".join(folders) or "-"


def cmd_list(args: argparse.Namespace) -> int:
    roots = DataRoots.from_env()
    manifest = load_manifest()
    statuses = list_files(args.names, roots=roots, manifest=manifest)
    if args.json:
        print(json.dumps([{"dataset": s.file.dataset, "path": s.file.path, "status": s.status,
                           "folder": None if s.folder is None else str(s.folder), "detail": s.detail,
                           "size_bytes": s.file.size_bytes, "sha256": s.file.sha256} for s in statuses], indent=2))
        return 0
    by_set: dict[str, list[FileStatus]] = {}
    for s in statuses:
        by_set.setdefault(s.file.dataset, []).append(s)
    rows = []
    for name, group in by_set.items():
        d = manifest.dataset(name)
        count = Counter(s.status for s in group)
        state = "present" if count["present"] == len(group) else ", ".join(
            f"{count[k]} {k}" for k in ("present", "missing", "corrupt") if count[k])
        rows.append([name, len(group), _size(d.size_bytes), state, _where(group), d.license])
    print_table(["data set", "files", "size", "status", "found in", "license"], rows,
                title=f"data folders: {roots.cache} (${CACHE_ENV}), then {roots.shared}")
    # a data set missing as a whole is one row above; a partial or corrupt one gets its files
    whole = {name for name, group in by_set.items() if all(s.status == "missing" for s in group)}
    shown = [s for s in statuses if args.files or (s.status != "present" and s.file.dataset not in whole)]
    if shown:
        print_table(["file", "status", "found in", "detail"],
                    [[s.file.path, s.status, "" if s.folder is None else str(s.folder), s.detail] for s in shown])
    if any(s.status != "present" for s in statuses):
        missing = sorted({s.file.dataset for s in statuses if s.status != "present"})
        print(f"to get them: slicesched data fetch {' '.join(missing)}")
    return 0
