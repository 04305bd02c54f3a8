"""Shared plumbing for benchmarks: arguments, the JSON record, and where it is written.

Every benchmark answers one question, takes ``--seed`` and ``--quick``, prints one JSON object
as its last line and writes the same object to ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.graph.connection import Neo4jSettings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


class _Parser(argparse.ArgumentParser):
    """Refuses, before anything runs, to write a record into benchmarks/results from a tree with
    uncommitted changes: such a record could not be reproduced (``--allow-dirty`` writes it
    anyway, marked ``"dirty": true``)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed = super().parse_args(args, namespace)
        if Path(parsed.out).resolve() == RESULTS.resolve() and dirty() and not parsed.allow_dirty:
            self.error("the working tree has uncommitted changes, so the record could not be reproduced: commit "
                       "first, write elsewhere (--out DIR), or pass --allow-dirty (the record is marked dirty)")
        return parsed


@contextlib.contextmanager
def private_neo4j(prefix: str) -> Iterator[Neo4jSettings]:
    """A Neo4j server of its own in a temporary state directory, started for the benchmark and
    stopped after it (a private graph: nothing of another run or user is touched)."""
    from service.graph.connection import Neo4jSettings
    from service.graph.local_server import LocalNeo4j

    with tempfile.TemporaryDirectory(prefix=prefix) as state:
        server = LocalNeo4j(Path(state) / "neo4j")
        info = server.start(log=False)
        try:
            user, password = server.auth()
            yield Neo4jSettings(uri=info.uri, user=user, password=password, state_dir=server.state_dir)
        finally:
            server.stop()


def parser(name: str, question: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"benchmarks/{name}.py", description=question)
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    p.add_argument("--quick", action="store_true", help="a short run (CI-sized)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON record")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write into benchmarks/results from a tree with uncommitted changes (marked dirty)")
    return p


def dirty() -> bool:
    try:
        # records themselves do not change what is measured: a batch of benchmarks writes one
        # after another into benchmarks/results from the same commit
        out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                              ".", ":(exclude)benchmarks/results"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    return bool(out.strip())


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return out + ("-dirty" if dirty() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            # other work on the machine when the record is written (timings on shared cores move with it)
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def write(name: str, args: argparse.Namespace, config: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    record = {
        "benchmark": name, "seed": args.seed, "quick": args.quick,
        "commit": commit(), "dirty": dirty(), "machine": machine(), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": config, "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(json.dumps(record, default=float), flush=True)
    return record
