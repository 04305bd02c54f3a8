"""``slicesched audit verify``: check the audit log's hash chain in Neo4j.

It walks every entry in seq order (pages read through the seq index), recomputes each hash,
checks each link and the stored head, and names the first entry that breaks the chain and why
(altered, removed, reordered, inserted). Exit codes: 0 intact, 1 broken, 2 a bad argument,
3 Neo4j unreachable. Progress goes to stderr every couple of seconds; the result to stdout (one
JSON object with ``--json``). ``--anchor SEQ:HASH`` (a seq and hash printed by an earlier run)
also checks that the chain was not rewritten since.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from service.domain.error import InvalidInputError

EXIT_BROKEN = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("audit", help="the audit log: verify its hash chain")
    actions = p.add_subparsers(dest="action", required=True)
    v = actions.add_parser("verify", help="walk the chain, recompute every hash, name the first bad entry "
                                          "(exit 0 intact, 1 broken)")
    v.add_argument("--anchor", metavar="SEQ:HASH", help="a seq and its hash from an earlier verify: the chain must "
                                                        "still pass through it")
    v.add_argument("--page", type=int, default=20_000, help="entries read per page (default 20000)")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.add_argument("--quiet", action="store_true", help="no progress on stderr")
    v.set_defaults(func=cmd_verify)


def parse_anchor(text: str) -> tuple[int, str]:
    seq, sep, digest = text.partition(":")
    if not sep or not seq.isdigit() or int(seq) < 1 or len(digest) != 64 or \
            any(c not in "0123456789abcdef" for c in digest):
        raise InvalidInputError(f"--anchor expects SEQ:HASH (a seq >= 1 and 64 hex digits), got {text!r}")
    return int(seq), digest


def cmd_verify(args: argparse.Namespace) -> int:
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository

    anchor = parse_anchor(args.anchor) if args.anchor else None
    if args.page < 1:
        raise InvalidInputError("--page must be at least 1")
    settings = Neo4jSettings.from_env()
    driver = open_driver(settings)
    last_shown = [time.perf_counter()]

    def progress(entries: int, seconds: float) -> None:
        now = time.perf_counter()
        if not args.quiet and now - last_shown[0] >= 2.0:
            last_shown[0] = now
            print(f"  {entries:,} entries checked ({entries / max(seconds, 1e-9):,.0f}/s)", file=sys.stderr, flush=True)

    started = time.perf_counter()
    try:
        result = GraphRepository(driver, database=settings.database).audit.verify_audit(anchor=anchor, page=args.page,
                                                                                  progress=progress)
    finally:
        driver.close()
    seconds = time.perf_counter() - started
    if args.json:
        print(json.dumps({**result.public(), "seconds": seconds}))
    elif result.ok and result.entries == 0:
        print("intact: the audit log is empty")
    elif result.ok:
        print(f"intact: {result.entries:,} entries in {seconds:.1f}s; head seq {result.last_seq} "
              f"hash {result.last_hash}\n(keep '{result.last_seq}:{result.last_hash}' and pass it as --anchor later)")
    else:
        print(f"BROKEN at seq {result.first_bad_seq}: {result.reason} ({result.entries:,} entries read in "
              f"{seconds:.1f}s; intact up to seq {result.last_seq})")
    return 0 if result.ok else EXIT_BROKEN
