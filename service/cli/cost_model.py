"""``slicesched cost-model train``: the learned package's trainer, plus ``--from-gmg [--since]``.

``--from-gmg`` reads the slices the executors measured from the GMG (Neo4j through the
``SLICESCHED_NEO4J_*`` settings, as ``serve`` reaches it; ``--since`` an ISO time: only those
observed from then on), keeps them as a JSON-lines file beside the artifacts (named by its bytes,
:func:`learned.observations.observations_file`), makes sure the default artifact exists, and
refits its GNN on its samples plus the observations' (:func:`learned.observations.train_observed`:
an ``observed-<key>`` folder beside it, named by the base, the observations and the code).
Without ``--from-gmg`` every option is the trainer's (:func:`learned.artifact.train_main`). Exit 2 when the options are bad or the GMG holds no
observation to train on; 3 when Neo4j cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from learned.artifact import TrainingInputs, default_cache_dir, profiles_from_env, train_main
from learned.choice import TRAIN_COMMAND
from learned.evaluate import default_data_dir
from learned.observations import ObservedSlice, load_observed, observations_file, train_observed
from service.domain.error import SliceschedError
from service.live.retraining import trace_observed

if TYPE_CHECKING:
    from service.graph.connection import Neo4jSettings

EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def parse_since(value: str) -> float | None:
    """Epoch seconds of an ISO time (``Z`` or an offset; none given: UTC); ``None`` if it is not one."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def observations_from_gmg(since_wall: float, settings: Neo4jSettings | None = None) -> list[ObservedSlice]:
    """The slice observations in the GMG from ``since_wall`` (epoch s) on, oldest first (the
    database ``settings`` name; default: the environment's)."""
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository

    settings = settings or Neo4jSettings.from_env()
    driver = open_driver(settings, start=False)
    try:
        rows = GraphRepository(driver, database=settings.database).live.slice_observations(since_wall)
    finally:
        driver.close()
    return [ObservedSlice.from_row(r) for r in rows]


def train_command(argv: Sequence[str] | None = None) -> int:
    """``slicesched cost-model train [--from-gmg [--since ISO-TIME]] [trainer options]``."""
    p = argparse.ArgumentParser(prog=TRAIN_COMMAND, add_help=False)
    p.add_argument("--from-gmg", action="store_true")
    p.add_argument("--since", default=None)
    args, rest = p.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if "-h" in rest or "--help" in rest:
        print("  --from-gmg            then refit the GNN on the slices the executors measured, read from the GMG\n"
              "                        (only --data-dir, --profile, --cache-dir and --force apply to it)\n"
              "  --since ISO-TIME      with --from-gmg: only observations from this time on\n")
        return train_main(rest)
    if args.since is not None and not args.from_gmg:
        print(f"{TRAIN_COMMAND}: --since needs --from-gmg", file=sys.stderr)
        return EXIT_BAD_INPUT
    since_wall = parse_since(args.since) if args.since is not None else 0.0
    if since_wall is None:
        print(f"{TRAIN_COMMAND}: --since {args.since!r} is not an ISO time (e.g. 2026-12-04T18:00:00Z)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.from_gmg:
        return train_main(rest)
    q = argparse.ArgumentParser(prog=f"{TRAIN_COMMAND} --from-gmg")
    q.add_argument("--data-dir", type=Path, default=None)
    q.add_argument("--profile", type=Path, action="append", default=[])
    q.add_argument("--cache-dir", type=Path, default=None)
    q.add_argument("--force", action="store_true")
    opts = q.parse_args(rest)  # exits 2 on a trainer option that does not apply
    try:
        rows = observations_from_gmg(since_wall)
    except Exception as exc:  # the driver raises several kinds for an unreachable or refusing server
        print(f"{TRAIN_COMMAND}: cannot read the GMG: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not rows:
        print(f"{TRAIN_COMMAND}: no slice observations in the GMG" + (f" since {args.since}" if args.since else ""),
              file=sys.stderr)
        return EXIT_BAD_INPUT
    cache_dir = opts.cache_dir or default_cache_dir()
    path = observations_file(rows, cache_dir)
    print(f"{len(rows)} slice observations from the GMG in {path}", file=sys.stderr)
    base_argv = [*(["--data-dir", str(opts.data_dir)] if opts.data_dir else []),
                 *(a for prof in opts.profile for a in ("--profile", str(prof))), "--cache-dir", str(cache_dir)]
    rc = train_main(base_argv)  # the base artifact: present already unless the inputs changed
    if rc:
        return rc
    inputs = TrainingInputs(opts.data_dir or default_data_dir(), tuple(opts.profile) or profiles_from_env())
    try:
        target = train_observed(path, inputs, cache_dir, trace_observed, force=opts.force)
    except SliceschedError as exc:
        print(f"{TRAIN_COMMAND}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    loaded = load_observed(target)
    print(json.dumps({"artifact": str(target), "sha256": loaded.sha256, "observations": len(rows),
                      "base": json.loads((target / "meta.json").read_text())["base_artifact"]}))
    return 0
