"""``slicesched experiments list|show|compare|rerun``: the experiment records in Neo4j.

``list`` and ``show`` print records (``--json`` for scripts). ``compare A B`` prints the
differences in configuration and, per policy and load, the headline results side by side, and
writes a comparison plot. ``rerun ID`` runs a replay experiment again from its recorded options
and compares: exit 0 "reproduced exactly" when the code version, the data digests, the cost
model and every result number are the same; exit 1 naming each difference otherwise (wall-clock
timings are never compared: :data:`~service.domain.experiment.UNREPRODUCIBLE_FIELDS`). An
unknown id is exit 2, Neo4j unreachable exit 3 (service/domain/error.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.graph.repository import GraphRepository

import argparse
import json
from pathlib import Path
from typing import Any

from service.domain.error import InvalidInputError
from service.domain.experiment import (
    HEADLINE_FIGURES,
    KINDS,
    Experiment,
    comparison,
    headline_rows,
    record_doc,
    reproduction,
)
from service.harness.console import print_table
from service.live.plots import plot_headline

EXIT_DIFFERS = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("experiments", help="recorded experiments (replay --record): list, show, compare, rerun")
    actions = p.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help="recorded experiments, newest first")
    ls.add_argument("--project", help="only this project's")
    ls.add_argument("--kind", choices=KINDS, help="only this kind")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.add_argument("--json", action="store_true", help="print them as JSON")
    ls.set_defaults(func=cmd_list)
    sh = actions.add_parser("show", help="one experiment: config, code version, data digests, results, plots")
    sh.add_argument("id", help="the experiment's uid")
    sh.add_argument("--json", action="store_true", help="print the whole record as JSON")
    sh.set_defaults(func=cmd_show)
    co = actions.add_parser("compare", help="config and result differences of two experiments, with a plot")
    co.add_argument("a", metavar="A", help="the first experiment's uid")
    co.add_argument("b", metavar="B", help="the second experiment's uid")
    co.add_argument("--out", help="folder for the comparison plot (default compare-A-B)")
    co.set_defaults(func=cmd_compare)
    re = actions.add_parser("rerun", help="run a replay experiment again; exit 0 if reproduced exactly, "
                                          "1 naming what differs")
    re.add_argument("id", help="the experiment's uid")
    re.add_argument("--out", help="folder for the rerun's report and plots (default rerun-ID)")
    re.set_defaults(func=cmd_rerun)


def _repository() -> GraphRepository:
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository

    settings = Neo4jSettings.from_env()
    repo = GraphRepository(open_driver(settings), database=settings.database)
    repo.apply_schema()
    return repo


# ---- list and show ------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidInputError("--limit must be at least 1")
    rows = _repository().experiments.list_experiments(project=args.project, kind=args.kind, limit=args.limit)
    if args.json:
        print(json.dumps(rows))
        return 0
    # the output folder is left to `show` (and --json): a path would fold every uid in two
    print_table(["uid", "kind", "project", "created (UTC)", "seed", "commit", "cost model"],
                [[r["uid"], r["kind"], r["project"], (r["created_at"] or "")[:19].replace("T", " "), r["seed"],
                  None if r["code_commit"] is None else r["code_commit"][:12] + (" dirty" if r["code_dirty"] else ""),
                  r["cost_model_kind"]] for r in rows], title="experiments")
    print(f"{len(rows)} experiment(s)")
    return 0


def _plot_state(path: str, sha256: str) -> str:
    from service.provenance import file_sha256

    p = Path(path)
    if not p.is_file():
        return "missing"
    return "ok" if file_sha256(p) == sha256 else "changed since recorded"


def cmd_show(args: argparse.Namespace) -> int:
    e = _repository().experiments.get_experiment(args.id)
    if args.json:
        print(json.dumps(record_doc(e), default=float))
        return 0
    c = e.config
    print_table(["", e.uid], [
        ["kind", e.kind], ["project", e.project], ["tenant", e.tenant_id], ["created_at", e.created_at],
        ["code", e.code.describe()], ["package version", e.code.package_version], ["seed", e.seed],
        ["cluster", c.get("cluster")], ["tenants", c.get("tenants")], ["trace", c.get("trace")],
        ["policies", c.get("policies")], ["loads", c.get("loads")], ["duration_s", c.get("duration_s")],
        ["interval_s", c.get("interval_s")], ["kv", c.get("kv")],
        ["cost model", f"{e.cost_model.get('kind')} " + (f"(artifact sha256 {e.cost_model_sha256})"
                                                         if e.cost_model_sha256 else "(no artifact)")],
        ["output", e.out_dir]], title="experiment")
    print_table(["data read", "sha256"], sorted(e.data_digests.items()), title="data digests")
    by_key: dict[str, list[Any]] = {}
    for key, _label, value, _ in headline_rows(e.results, []):
        by_key.setdefault(key, []).append(value)
    print_table(["policy x load", *[label for label, _ in HEADLINE_FIGURES]],
                [[key, *values] for key, values in by_key.items()], title="results")
    print_table(["plot", "sha256", "bytes", "file"],
                [[p.path, p.sha256[:16], p.size_bytes, _plot_state(p.path, p.sha256)] for p in e.plots],
                title="plots")
    return 0


# ---- compare ------------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    repo = _repository()
    a, b = repo.experiments.get_experiment(args.a), repo.experiments.get_experiment(args.b)
    out = Path(args.out or f"compare-{a.uid}-{b.uid}")
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {out} exists and is not a folder")
    _print_differences(a, b)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "compare.png"
    plot_comparison(path, a, b)
    print(f"wrote {path}")
    return 0


def _print_differences(a: Experiment, b: Experiment) -> None:
    doc = comparison(a, b)
    config, data = doc["config_differences"], [[f"data {k}", va, vb] for k, va, vb in doc["data_differences"]]
    print_table(["", a.uid, b.uid], doc["top"] + config + data, title="configuration: what differs")
    if not config and not data:
        print("same configuration and data")
    print_table(["policy x load", "figure", a.uid, b.uid, "B - A"],
                [[key, label, va, vb, delta(va, vb)] for key, label, va, vb in doc["rows"]],
                title="results side by side")
    n = doc["result_differences"]
    print(f"{n} result value(s) differ" if n else "every result value is the same")


def delta(a: Any, b: Any) -> Any:
    """B - A for two numbers; None otherwise."""
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return b - a
    return None


def plot_comparison(path: Path, a: Experiment, b: Experiment) -> None:
    """Bars of token throughput and SLA-violation rate per policy and load, A beside B."""
    plot_headline(path, headline_rows(a.results, b.results), a.uid, b.uid)




# ---- rerun --------------------------------------------------------------------------------------
def cmd_rerun(args: argparse.Namespace) -> int:
    from service.cli.replay import execute, experiment_of, replay_arguments
    from service.replay.mix import forget_read_data

    record = _repository().experiments.get_experiment(args.id)
    if record.kind != "replay":
        raise InvalidInputError(f"experiment {record.uid} is a {record.kind} run: only replay experiments can be "
                                "rerun")
    options = record.config.get("options")
    if not isinstance(options, dict):
        raise InvalidInputError(f"experiment {record.uid} was recorded without its replay options (an older "
                                "record): it cannot be rerun")
    out = Path(args.out or f"rerun-{record.uid}")
    forget_read_data()  # the digests are taken from the files now: the run must read the same bytes
    outcome = execute(replay_arguments(options, out))
    rerun = experiment_of(outcome, uid=f"{record.uid}-rerun", project=record.project, tenant_id=record.tenant_id)
    check = reproduction(record, rerun)
    print(f"reran {record.uid} into {out}")
    _print_plot_notes(record, rerun)
    if check.exact:
        print(f"reproduced exactly: {len(record.results)} result(s), every number the same "
              f"(code {rerun.code.describe()}, {len(rerun.data_digests)} data digest(s) the same; wall-clock "
              "timings not compared)")
        return 0
    if not check.results:
        print("results reproduced number for number, but not from the same inputs:")
    else:
        print(f"not reproduced: {len(check.results)} result value(s) differ")
    for line in check.lines():
        print(f"  {line}")
    return EXIT_DIFFERS


def _print_plot_notes(record: Experiment, rerun: Experiment) -> None:
    """Plots are not part of a reproduction (their bytes move with the matplotlib version, not
    with the results): said, not counted."""
    before = {p.name: p.sha256 for p in record.plots}
    after = {p.name: p.sha256 for p in rerun.plots}
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if changed:
        print(f"note: {len(changed)} plot(s) not byte-identical to the recorded ones (not compared as results): "
              + ", ".join(changed))
    else:
        print(f"plots: all {len(after)} byte-identical to the recorded ones")
