"""The ``slicesched`` command.

Every subcommand maps domain errors to one line on stderr and a non-zero exit code, the one the
error's class declares (service/domain/error.py: 1 internal, 2 bad input, 3 Neo4j or the service
unavailable); no traceback reaches the user for an expected failure. Heavy imports (torch, neo4j)
happen inside the subcommands that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.graph.repository import GraphRepository

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from service import environment as env
from service.domain.error import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, SliceschedError
from service.harness.console import print_table

Handler = Callable[[argparse.Namespace], int]


# ---- output --------------------------------------------------------------------------------------
def _parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    from service.domain.error import InvalidInputError

    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"--param expects KEY=VALUE, got {pair!r}")
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


def _repository() -> GraphRepository:
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository

    settings = Neo4jSettings.from_env()
    repo = GraphRepository(open_driver(settings), database=settings.database)
    repo.apply_schema()
    return repo


# ---- neo4j ---------------------------------------------------------------------------------------
def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port in 1..65535, got {raw!r}")
    return port


def cmd_neo4j(args: argparse.Namespace) -> int:
    from service.graph.connection import Neo4jSettings
    from service.graph.local_server import LocalNeo4j

    settings = Neo4jSettings.from_env()
    if not settings.managed:
        print(f"SLICESCHED_NEO4J_URI is set ({settings.uri}): the managed server is not used.", file=sys.stderr)
        return EXIT_BAD_INPUT if args.action != "status" else 0
    server = LocalNeo4j(Path(args.state_dir) if args.state_dir else settings.state_dir)
    if args.port is not None and args.action != "start":
        print("--port is for 'start' only", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.action == "start":
        running = server.status()
        if running is not None and args.port is not None and running.port != args.port:
            print(f"already running on port {running.port} ({running.uri}): stop it first to move it to {args.port}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        info = server.start(port=args.port)
        print(f"running  {info.uri}  {server.server_version(info)}  pid {info.pid}  state {info.state_dir}")
        return 0
    if args.action == "stop":
        print("stopped" if server.stop() else "not running")
        return 0
    found = server.status()
    if found is None:
        print(f"not running (state dir {server.state_dir})")
        return 1
    print(f"running  {found.uri}  {server.server_version(found)}  pid {found.pid}  state {found.state_dir}")
    return 0


# ---- config --------------------------------------------------------------------------------------
def cmd_config(args: argparse.Namespace) -> int:
    """Every SLICESCHED_* variable with its default and the value in force (secrets masked); a
    malformed value set in the environment is refused (exit 2) naming it."""
    if args.markdown:
        print(env.markdown(), end="")
        return 0
    env.check_all()
    if args.json:
        print(json.dumps(env.listing(), indent=1))
        return 0
    rows = [(r["name"], r["concern"], r["default"], r["value"], r["range"], r["help"]) for r in env.listing()]
    print_table(["variable", "read by", "default", "set to", "allowed", "what it does"], rows,
                title="Configuration (slicesched config --list; docs: Configuration)")
    return 0


# ---- cluster -------------------------------------------------------------------------------------
def cmd_cluster_apply(args: argparse.Namespace) -> int:
    from service.cluster.spec import load_cluster_spec

    spec = load_cluster_spec(args.spec)
    counts = _repository().cluster.apply_cluster(spec)
    print(f"applied {spec.name}: {counts['hosts']} hosts, {counts['devices']} devices, {counts['links']} directed links")
    return 0


def cmd_cluster_list(args: argparse.Namespace) -> int:
    from service.cluster.spec import builtin_names, load_cluster_spec

    rows = []
    for name in builtin_names():
        spec = load_cluster_spec(name)
        kinds = sorted({d.kind for d in spec.devices})
        rows.append([name, len(spec.hosts), len(spec.devices), ", ".join(kinds), spec.total_mem_bytes / 2**30])
    print_table(["spec", "hosts", "devices", "kinds", "mem_gib"], rows, title="built-in cluster specs")
    return 0


# ---- models --------------------------------------------------------------------------------------
def cmd_model_list(args: argparse.Namespace) -> int:
    from service.domain.model_config import MODEL_CONFIGS

    rows = [[c.name, c.style, c.num_params(), c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.dtype,
             "shape-only" if c.shape_only else "runs on CPU"] for c in MODEL_CONFIGS.values()]
    print_table(["model", "style", "params", "layers", "d_model", "heads", "kv_heads", "dtype", ""], rows,
                title="built-in model family")
    return 0


def _trace(args: argparse.Namespace) -> Any:
    """The phase's operator graph of the built-in model ``args.name`` or of the model directory
    ``args.path`` (its config.json, traced on the meta device: no weights are read)."""
    from dataclasses import replace

    from service.domain.error import InvalidInputError
    from service.domain.model_config import model_config
    from service.models.trace import trace_phase

    if (args.name is None) == (args.path is None):
        raise InvalidInputError("name a built-in model (see 'slicesched model list') or pass --path DIR"
                                + (" or --graph FILE" if hasattr(args, "graph") else ""))
    overrides = {"n_layers": args.layers} if args.layers else {}
    if args.path is not None:
        from service.models.hf import hf_config

        config = replace(hf_config(Path(args.path).absolute()), **overrides)
    else:
        config = model_config(args.name, **overrides)
    return trace_phase(config, args.phase, batch=args.batch, tokens=args.tokens, context=args.context)


def cmd_model_import(args: argparse.Namespace) -> int:
    from service.domain.error import InvalidInputError
    from service.domain.opgraph import OperatorGraph

    if args.graph:
        try:
            data = json.loads(Path(args.graph).read_text())
        except OSError as exc:
            raise InvalidInputError(f"cannot read {args.graph}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{args.graph}: not valid JSON: {exc}") from None
        graph = OperatorGraph.from_dict(data)
        model_id = args.model_id or graph.model_name
    else:
        graph = _trace(args)
        model_id = args.model_id or args.name or Path(args.path).absolute().name
    stats = _repository().models.import_model(args.tenant, model_id, graph, device_id=args.device)
    print(f"imported {stats.model_uid} {stats.phase}: {stats.operators} operators, {stats.tensors} tensors, "
          f"{stats.edges} edges in {stats.seconds:.2f}s"
          + (f"; weights resident on {args.device}" if args.device else ""))
    return 0


def cmd_model_export(args: argparse.Namespace) -> int:
    graph = _trace(args)
    text = json.dumps(graph.to_dict(), indent=1)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: {len(graph.operators)} operators, {len(graph.tensors)} tensors")
    else:
        print(text)
    return 0


# ---- traces ----------------------------------------------------------------------------------------
def cmd_trace_stats(args: argparse.Namespace) -> int:
    import numpy as np

    from service.workload.readers import read_trace

    result = read_trace(args.file, args.format, skip_bad=args.skip_bad)
    reqs = result.requests
    if not reqs:
        print(f"{args.file}: no valid requests ({result.num_bad} bad lines)")
        return EXIT_BAD_INPUT
    arrivals = np.array([r.arrival_s for r in reqs])
    prompt = np.array([r.prompt_tokens for r in reqs])
    output = np.array([r.output_tokens for r in reqs])
    duration = float(arrivals[-1] - arrivals[0]) or 1.0
    gaps = np.diff(arrivals)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")
    rows = [["requests", len(reqs)], ["duration_s", duration], ["rate_rps", len(reqs) / duration],
            ["inter-arrival CV", cv]]
    for name, arr in (("prompt_tokens", prompt), ("output_tokens", output)):
        p50, p90, p99 = np.percentile(arr, [50, 90, 99])
        rows.append([name, f"mean {arr.mean():.0f}  p50 {p50:.0f}  p90 {p90:.0f}  p99 {p99:.0f}  max {arr.max()}"])
    rows.append(["bad lines skipped", result.num_bad])
    print_table(["", args.file], rows)
    for line, reason in result.bad_lines:
        print(f"  line {line}: {reason}")
    return 0


# ---- cypher --------------------------------------------------------------------------------------
def cmd_cypher(args: argparse.Namespace) -> int:
    from service.domain.error import InvalidInputError

    if args.list:
        from service.graph.catalog import QueryCatalog

        queries = sorted(QueryCatalog.load().by_category("inspect"), key=lambda q: q.name)
        print_table(["name", "parameters", "what it shows"],
                    [[q.name, ", ".join(p + ("?" if p in q.optional else "") for p in q.params), q.description]
                     for q in queries], title="named inspection queries")
        return 0
    params = _parse_params(args.param)
    repo = _repository()
    if args.named:
        table = repo.inspection.run_named(args.named, params)
        title = args.named
    elif args.query:
        table = repo.inspection.run_read(args.query, params)
        title = None
    else:
        raise InvalidInputError("give a query, --named NAME or --list")
    if args.json:
        print(json.dumps([dict(zip(table.columns, r, strict=True)) for r in table.rows], default=str))
    else:
        print_table(table.columns, table.rows, title=title)
        print(f"{len(table.rows)} row(s)")
    return 0


# ---- keys (over HTTP, with the admin key) ----------------------------------------------------------
def _admin_key() -> str:
    from service.domain.error import InvalidInputError
    from service.live.settings import state_dir

    key = env.raw("SLICESCHED_ADMIN_KEY")
    if key:
        return key
    path = state_dir() / "admin.key"
    try:
        return path.read_text().strip()
    except OSError:
        raise InvalidInputError(f"no admin key: set SLICESCHED_ADMIN_KEY or start 'slicesched serve' once "
                                f"(it writes {path})") from None


def cmd_keys(args: argparse.Namespace) -> int:
    """Create executor pools and rotate or revoke tenant and pool keys through the service."""
    import httpx

    from service.domain.error import InvalidInputError

    body: dict[str, Any] | None = None
    if args.action == "create-pool":
        path = "/v1/executor-pools"
        pool: dict[str, Any] = {"pool_id": args.pool_id, "max_devices": args.max_devices}
        if args.kinds:
            pool["allowed_kinds"] = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if args.max_mem_gib is not None:
            pool["max_mem_bytes"] = int(args.max_mem_gib * 2**30)
        body = pool
    else:
        if (args.tenant is None) == (args.pool is None):
            raise InvalidInputError("give exactly one of --tenant TENANT and --pool POOL")
        owner = f"tenants/{args.tenant}" if args.tenant is not None else f"executor-pools/{args.pool}"
        path = f"/v1/{owner}/keys/{args.action}"
    try:
        with httpx.Client(base_url=args.server, headers={"Authorization": f"Bearer {_admin_key()}"},
                          timeout=30.0) as client:
            response = client.post(path, json=body)
    except httpx.HTTPError as exc:
        print(f"error: the service at {args.server} is unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
            message = f"{error['kind']}: {error['message']}"
        except (ValueError, KeyError, TypeError):
            message = response.text[:200] or response.reason_phrase
        print(f"error: {response.status_code} {message}", file=sys.stderr)
        return EXIT_BAD_INPUT if response.status_code < 500 else EXIT_UNAVAILABLE
    data = response.json()
    if args.json:
        print(json.dumps(data))
    elif "api_key" in data:
        who = f"tenant {data['tenant_id']}" if "tenant_id" in data else f"executor pool {data['pool_id']}"
        print(f"{who}: new key {data['api_key']} (shown once; any previous key is refused from now on)")
    else:
        who = f"tenant {data['tenant_id']}" if "tenant_id" in data else f"executor pool {data['pool_id']}"
        dropped = data.get("executors_dropped") or []
        print(f"{who}: key revoked" + (f"; executors dropped: {', '.join(dropped)}" if dropped else ""))
    return 0


# ---- subsystems with their own argument parsers --------------------------------------------------
# (command words, "module:function" taking argv, help). The words select the entry before
# argparse sees the rest, so each subsystem parses (and documents) its own options.
PASSTHROUGH: list[tuple[tuple[str, ...], str, str]] = [
    (("cost-model", "train"), "service.cli.cost_model:train_command",
     "train the default cost-model artifact (table, GNN, host overheads) into the cache"),
    (("cost-model", "evaluate"), "learned.evaluate:evaluate_main", "held-out accuracy of every cost model"),
    (("profile",), "executor.profiler:profile_main", "time the project's operators on this CPU"),
    (("predictors",), "service.cli.predictors:predictors_main",
     "distributional predictors of workflow calls: record|train|calibration"),
    (("serve",), "service.cli.serve:serve_main", "run the HTTP scheduling API (docs/API.md)"),
    (("executor",), "executor.command:main", "run an executor daemon for this node's devices"),
    (("console",), "service.webconsole.command:console_main",
     "run the web console for people (pages calling the API with the signed-in user's key)"),
]


def _passthrough(entry: str, argv: list[str]) -> int:
    import importlib

    module_name, func_name = entry.split(":")
    return int(getattr(importlib.import_module(module_name), func_name)(argv) or 0)


# ---- demo ----------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from service.harness.demo import run_demo

    return run_demo(args)


# ---- parser --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slicesched",
                                description="slicesched: operator-level scheduling of multi-tenant LLM serving")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cfg = sub.add_parser("config", help="the SLICESCHED_* settings: defaults, values in force, checks")
    cfg.add_argument("--list", action="store_true", help="list every variable (the default action)")
    cfg.add_argument("--json", action="store_true", help="as JSON")
    cfg.add_argument("--markdown", action="store_true", help="the docs' table (Markdown), without values")
    cfg.set_defaults(func=cmd_config)

    neo = sub.add_parser("neo4j", help="manage the local Neo4j server (jars from Maven Central, Java 17)")
    neo.add_argument("action", choices=["start", "stop", "status"])
    neo.add_argument("--port", type=_port, help="start: the Bolt port on 127.0.0.1 (default: a free one)")
    neo.add_argument("--state-dir", help="server state dir (default: $SLICESCHED_STATE/neo4j or ~/.local/state/slicesched/neo4j)")
    neo.set_defaults(func=cmd_neo4j)

    cl = sub.add_parser("cluster", help="register devices and links").add_subparsers(dest="action", required=True)
    ap = cl.add_parser("apply", help="register the hosts, devices and links of a spec")
    ap.add_argument("spec", help="built-in spec name (see 'cluster list') or a YAML/JSON file")
    ap.set_defaults(func=cmd_cluster_apply)
    cl.add_parser("list", help="list built-in specs").set_defaults(func=cmd_cluster_list)

    mo = sub.add_parser("model", help="trace models into the GMG").add_subparsers(dest="action", required=True)
    mo.add_parser("list", help="list the built-in model family").set_defaults(func=cmd_model_list)
    for action, helptext in (("import", "trace a model phase (or read --graph FILE) into the GMG for a tenant"),
                             ("export", "trace a model phase and print its operator graph as JSON")):
        m = mo.add_parser(action, help=helptext)
        m.add_argument("name", nargs="?", help="built-in model (see 'model list'); or give --path")
        m.add_argument("--path", help="a Hugging Face model directory (config.json; model_type llama or gpt2) "
                                      "traced instead of a built-in model")
        m.add_argument("--phase", choices=["prefill", "decode"], default="prefill")
        m.add_argument("--batch", type=int, default=1, help="sequences in the batch")
        m.add_argument("--tokens", type=int, default=128, help="prefill: tokens per sequence")
        m.add_argument("--context", type=int, default=512, help="decode: tokens already in the KV cache")
        m.add_argument("--layers", type=int, help="override the number of layers")
        if action == "import":
            m.add_argument("--tenant", required=True, help="tenant id (created if new)")
            m.add_argument("--model-id", help="the tenant's name for this model (default: the model name)")
            m.add_argument("--device", help="make the weights resident on this device")
            m.add_argument("--graph", help="import an operator-graph JSON file instead of tracing")
            m.set_defaults(func=cmd_model_import)
        else:
            m.add_argument("-o", "--output", help="write to this file instead of stdout")
            m.set_defaults(func=cmd_model_export)

    from service.cli.replay import add_parser as add_replay

    add_replay(sub)

    from service.cli.experiment import add_parser as add_experiments

    add_experiments(sub)

    from service.cli.data import add_parser as add_data

    add_data(sub)

    from service.cli.audit import add_parser as add_audit

    add_audit(sub)

    from service.cli.retention import add_parser as add_retention

    add_retention(sub)

    from service.harness.testbench.command import add_parser as add_testbench

    add_testbench(sub)

    tr = sub.add_parser("trace", help="production traces").add_subparsers(dest="action", required=True)
    ts = tr.add_parser("stats", help="summarise an Azure CSV or Mooncake JSONL trace")
    ts.add_argument("file")
    ts.add_argument("--format", choices=["auto", "azure", "mooncake"], default="auto")
    ts.add_argument("--skip-bad", action="store_true", help="count, skip and report malformed rows instead of failing")
    ts.set_defaults(func=cmd_trace_stats)

    cy = sub.add_parser("cypher", help="run a read-only Cypher query or a named inspection query")
    cy.add_argument("query", nargs="?", help="Cypher text (read-only: a write is refused)")
    cy.add_argument("--named", metavar="NAME", help="run cypher/inspect/NAME.cypher")
    cy.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="query parameter (JSON or string)")
    cy.add_argument("--list", action="store_true", help="list the named inspection queries")
    cy.add_argument("--json", action="store_true", help="print rows as JSON")
    cy.set_defaults(func=cmd_cypher)

    ke = sub.add_parser("keys", help="executor pools; rotate or revoke tenant and pool keys (admin key, over HTTP)")
    kactions = ke.add_subparsers(dest="action", required=True)
    for action, helptext in (("rotate", "a new key (shown once); the old one is refused at once"),
                             ("revoke", "the key is refused at once; a later rotate issues a new one"),
                             ("create-pool", "an executor pool with its own key (shown once) and device limits")):
        k = kactions.add_parser(action, help=helptext)
        if action == "create-pool":
            k.add_argument("pool_id", help="the pool's id")
            k.add_argument("--kinds", help="device kinds its executors may register, comma-separated "
                                           "(default: the catalogue's: cpu, A100-80GB, ...)")
            k.add_argument("--max-devices", type=int, default=64, help="devices its executors may register together")
            k.add_argument("--max-mem-gib", type=float, default=None, help="memory one device may declare (default 1024)")
        else:
            k.add_argument("--tenant", help="the tenant whose key to change")
            k.add_argument("--pool", help="the executor pool whose key to change")
        k.add_argument("--server", default=env.text("SLICESCHED_SERVER"),
                       help="the service's URL (default: $SLICESCHED_SERVER or http://127.0.0.1:8000)")
        k.add_argument("--json", action="store_true", help="print the answer as JSON")
        k.set_defaults(func=cmd_keys)

    de = sub.add_parser("demo", help="the end-to-end demo on the managed Neo4j and a synthetic workload")
    de.add_argument("--stop", action="store_true", help="stop the managed Neo4j when the demo ends")
    de.add_argument("--skip-live", action="store_true", help="only the GMG part (no API, executors or replay)")
    de.add_argument("--live-duration", type=float, default=60.0, help="seconds of arrivals per placement")
    de.add_argument("--out", default="demo-output", help="folder for the plots and JSON")
    de.add_argument("--seed", type=int, default=0)
    de.set_defaults(func=cmd_demo)

    groups: dict[str, Any] = {}
    for words, _, helptext in PASSTHROUGH:  # listed for --help; dispatched in main()
        if len(words) == 1:
            sub.add_parser(words[0], help=helptext)
            continue
        if words[0] not in groups:
            groups[words[0]] = sub.add_parser(words[0], help=f"{words[0]} commands").add_subparsers(required=True)
        groups[words[0]].add_parser(words[1], help=helptext)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        for prefix, entry, _ in PASSTHROUGH:
            if tuple(words[: len(prefix)]) == prefix:
                return _passthrough(entry, words[len(prefix):])
        args = build_parser().parse_args(words)
        return int(args.func(args) or 0)
    except SliceschedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code  # declared by the error's class: service/domain/error.py
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from neo4j.exceptions import ServiceUnavailable

        if isinstance(exc, ServiceUnavailable):
            print(f"error: Neo4j is unavailable: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        raise


if __name__ == "__main__":
    sys.exit(main())
