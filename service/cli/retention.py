"""``slicesched retention plan|run|verify-archive``: what grows, archived then deleted, on demand.

``plan`` says what a pass would archive and delete now (nothing changes); ``run`` does one whole
pass, each kind until nothing past its retention is left (:mod:`service.live.retention`: the
same code the service's supervised ``retention`` loop runs, against the same Neo4j, with the same
``SLICESCHED_RETAIN_*`` settings); ``verify-archive`` checks that the audit entries archived so
far form the chain from genesis to where the graph's kept chain starts. The result goes to stdout
as one JSON object. Exit codes: 0 done (verify: intact), 1 the archive is broken, 2 a bad setting,
3 Neo4j unreachable.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

EXIT_BROKEN = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("retention", help="archive then delete what is past its retention (requests, workflows, "
                                         "audit entries, observations)")
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("plan", help="what a pass would archive and delete now (changes nothing)").set_defaults(
        func=cmd_retention)
    actions.add_parser("run", help="one whole pass now: archive, check the archive, delete").set_defaults(
        func=cmd_retention)
    actions.add_parser("verify-archive", help="the archived audit entries chain from genesis to where the kept "
                                              "chain starts (exit 0 intact, 1 broken)").set_defaults(func=cmd_retention)


def cmd_retention(args: argparse.Namespace) -> int:
    from service import environment as env
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository
    from service.live.retention import Retention, RetentionSettings, verify_audit_archive
    from service.live.settings import state_dir

    env.check_all()
    settings = RetentionSettings.from_env()  # a bad setting is refused before Neo4j is reached
    observations = env.path("SLICESCHED_OBSERVATIONS_FILE") or state_dir() / "predictor" / "observations.jsonl"
    neo4j = Neo4jSettings.from_env()
    driver = open_driver(neo4j, start=False)
    try:
        repo = GraphRepository(driver, database=neo4j.database)
        if args.action == "verify-archive":
            through_seq, through_hash, files = repo.audit.audit_archive()
            result = verify_audit_archive(files)
            ok = result.ok and (result.last_seq, result.last_hash) == (through_seq, through_hash)
            print(json.dumps({"ok": ok, "files": len(files), "archived_through_seq": through_seq,
                              "chain": result.public()}))
            return 0 if ok else EXIT_BROKEN
        repo.apply_schema()  # the indexes the pages are read through
        retention = Retention(repo, settings, observations=observations)
        out = retention.plan() if args.action == "plan" else retention.run()
    finally:
        driver.close()
    print(json.dumps(out))
    return 0
