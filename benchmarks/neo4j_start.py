"""neo4j_start: how long does the managed Neo4j take to answer Bolt?

Cold: jars already cached, a fresh data dir (the store is created). Warm: a restart on an
existing data dir. Each is timed from process launch until ``verify_connectivity`` succeeds,
median over ``--repeats``; stop times are reported too.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record


def main() -> int:
    p = _record.parser("neo4j_start", __doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 2)

    from service.graph.local_server import LocalNeo4j

    install_started = time.perf_counter()
    LocalNeo4j().install()
    install_s = time.perf_counter() - install_started

    cold: list[float] = []
    warm: list[float] = []
    stop: list[float] = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="neo4j-start-") as state:
            server = LocalNeo4j(Path(state))
            for kind, bucket in (("cold", cold), ("warm", warm)):
                t = time.perf_counter()
                server.start(log=False)
                bucket.append(time.perf_counter() - t)
                t = time.perf_counter()
                server.stop()
                stop.append(time.perf_counter() - t)
                print(f"  repeat {i + 1}/{args.repeats} {kind}: {bucket[-1]:.2f}s (stop {stop[-1]:.2f}s)", flush=True)

    _record.write("neo4j_start", args, {"repeats": args.repeats, "version": LocalNeo4j().version}, {
        "install_s_when_cached": round(install_s, 3),
        "cold_start_s_median": round(statistics.median(cold), 2), "cold_start_s": [round(x, 2) for x in cold],
        "warm_start_s_median": round(statistics.median(warm), 2), "warm_start_s": [round(x, 2) for x in warm],
        "stop_s_median": round(statistics.median(stop), 2),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
