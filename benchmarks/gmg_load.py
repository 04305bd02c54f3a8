"""gmg_load: how fast does the GMG take bulk imports of Llama-shaped operator graphs?

Traces Llama-2 7B/13B/70B (prefill and decode) once each, then imports them for many tenants
until at least ``--operators`` operators are written, into a fresh managed Neo4j (own state dir,
stopped at the end). Reports operators plus edges (PRECEDES, READS, WRITES, HAS_OPERATOR)
written per second, overall and per writer, with ``--writers`` concurrent sessions.
Target: >= 20,000 items/s.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record


def main() -> int:
    p = _record.parser("gmg_load", __doc__.splitlines()[0])
    p.add_argument("--operators", type=int, default=100_000, help="operators to write in total")
    p.add_argument("--writers", type=int, default=2, help="concurrent import sessions")
    args = p.parse_args()
    if args.quick:
        args.operators = min(args.operators, 20_000)

    from neo4j import GraphDatabase

    from service.domain.model_config import model_config
    from service.graph.local_server import LocalNeo4j
    from service.graph.repository import GraphRepository
    from service.models.trace import trace_phase

    graphs = [trace_phase(model_config(name), phase, batch=8, tokens=512, context=1024)
              for name in ("llama2-7b", "llama2-13b", "llama2-70b") for phase in ("prefill", "decode")]
    print(f"traced {len(graphs)} graphs: " + ", ".join(f"{g.model_name}/{g.phase} {len(g.operators)} ops" for g in graphs),
          flush=True)

    with tempfile.TemporaryDirectory(prefix="gmg-load-") as state:
        server = LocalNeo4j(Path(state), heap="1g", pagecache="512m")
        info = server.start(log=False)
        try:
            driver = GraphDatabase.driver(info.uri, auth=server.auth())
            repo = GraphRepository(driver)
            repo.apply_schema()
            # Warm the JVM on one import that is not measured.
            repo.models.import_model("warmup", "m", graphs[0])

            jobs = []
            total_ops = 0
            for i, g in zip(itertools.count(), itertools.cycle(graphs)):
                if total_ops >= args.operators:
                    break
                jobs.append((f"tenant{i // len(graphs):04d}", f"{g.model_name}-{g.phase}", g))
                total_ops += len(g.operators)

            done = [0]
            rates: list[float] = []

            def run(job: tuple[str, str, object]) -> tuple[int, int]:
                tenant, model_id, graph = job
                stats = repo.models.import_model(tenant, model_id, graph)  # type: ignore[arg-type]
                rates.append(stats.items_per_s)
                done[0] += 1
                if done[0] % max(1, len(jobs) // 10) == 0:
                    print(f"  {done[0]}/{len(jobs)} imports", flush=True)
                return stats.operators, stats.edges

            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.writers) as pool:
                results = list(pool.map(run, jobs))
            wall = time.perf_counter() - started
            ops = sum(r[0] for r in results)
            edges = sum(r[1] for r in results)
            nodes_in_db = repo.cluster.count_labels()
            driver.close()
        finally:
            server.stop()

    items_per_s = (ops + edges) / wall
    _record.write("gmg_load", args, {
        "operators_target": args.operators, "writers": args.writers, "imports": len(jobs),
        "graphs": [f"{g.model_name}/{g.phase}" for g in graphs], "neo4j": info.version,
    }, {
        "operators": ops, "edges": edges, "wall_s": round(wall, 2),
        "items_per_s": round(items_per_s), "operators_per_s": round(ops / wall),
        "median_import_items_per_s": round(statistics.median(rates)),
        "target_items_per_s": 20_000, "meets_target": items_per_s >= 20_000,
        "operator_nodes_in_db": nodes_in_db.get("Operator", 0),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
