"""candidate_slots: how fast does Cypher find candidate slots in a 1,000-device GMG with live placements?

Builds a GMG in a fresh managed Neo4j (own state dir, stopped at the end): ``--hosts`` hosts of
``--gpus-per-host`` GPUs (A100 and H100 hosts alternating), NVLink between the GPUs of a host
(device LINKs) and a network link between every pair of hosts (host LINKs: the per-host link
model, hosts^2 edges instead of devices^2); tenants' Llama-2 7B/13B/70B models imported with
``GraphRepository.models.import_model`` until ``--operators`` operators are written, 7B/13B weights
resident on random devices (70B's do not fit one device); ``--slices-per-device`` live placements
per device (plus three done ones). Then runs ``--queries`` random slot queries (0-2 remote inputs,
half needing weights) through ``GraphRepository.slots.find_candidate_slots`` and through
``find_slots_in_memory`` on the same state, checks they agree, and reports latency percentiles.
Target: p99 <= 20 ms for the Cypher query.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

GB = 10**9


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> int:
    p = _record.parser("candidate_slots", __doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=125, help="hosts in the cluster")
    p.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per host (NVLink within a host)")
    p.add_argument("--operators", type=int, default=100_000, help="operators to import in total")
    p.add_argument("--slices-per-device", type=int, default=15, help="mean live placements per device (10-20)")
    p.add_argument("--queries", type=int, default=500, help="timed slot queries")
    p.add_argument("--k", type=int, default=8, help="slots per query")
    p.add_argument("--cluster", default="bench", help="cluster name (and prefix of host ids)")
    p.add_argument("--uri", default=None, help="use this running Neo4j instead of a fresh managed one (development; "
                                               "credentials from SLICESCHED_NEO4J_USER/PASSWORD)")
    args = p.parse_args()
    if args.quick:
        args.hosts, args.operators, args.queries = min(args.hosts, 16), min(args.operators, 10_000), min(args.queries, 100)

    from neo4j import GraphDatabase

    from service.core.slot import (
        ClusterState,
        DeviceView,
        InputDep,
        LinkView,
        PlacedSlice,
        Placement,
        SlotQuery,
        find_slots_in_memory,
    )
    from service.domain.cluster import ClusterSpec, Link
    from service.domain.model_config import model_config
    from service.graph.connection import Neo4jSettings
    from service.graph.local_server import LocalNeo4j
    from service.graph.repository import GraphRepository
    from service.models.trace import trace_phase

    rng = np.random.default_rng(args.seed)
    cluster = args.cluster
    kinds = ("A100-80GB", "H100-80GB")
    spec = ClusterSpec.from_dict({"name": cluster, "hosts": [
        {"host_id": f"{cluster}-h{h:03d}", "devices": {"kind": kinds[h % 2], "count": args.gpus_per_host},
         "intra_link": {"kind": "nvlink", "gbps": 2400, "latency_us": 2}} for h in range(args.hosts)]})
    host_links = [Link(a, b, "network", 400.0, 5.0) for a in spec.hosts for b in spec.hosts if a != b]
    device_ids = [d.device_id for d in spec.devices]

    names = ("llama2-7b", "llama2-13b", "llama2-70b")
    graphs = {(n, ph): trace_phase(model_config(n), ph, batch=8, tokens=512, context=1024)
              for n in names for ph in ("prefill", "decode")}
    print("traced: " + ", ".join(f"{n}/{ph} {len(g.operators)} ops" for (n, ph), g in graphs.items()), flush=True)

    with tempfile.TemporaryDirectory(prefix="candidate-slots-") as state_dir:
        server = LocalNeo4j(Path(state_dir), heap="1g", pagecache="512m")
        info = server.start(log=False) if args.uri is None else None
        try:
            auth = Neo4jSettings.from_env().auth if args.uri else server.auth()
            uri: str = args.uri or (info.uri if info is not None else "")
            driver = GraphDatabase.driver(uri, auth=auth)
            repo = GraphRepository(driver)
            repo.apply_schema()
            t = time.perf_counter()
            repo.cluster.apply_cluster(spec)
            repo.slots.replace_host_links(cluster, host_links)
            print(f"cluster: {len(spec.devices)} devices, {len(spec.links)} device links, "
                  f"{len(host_links)} host links in {time.perf_counter() - t:.1f}s", flush=True)

            # Models: both phases per model, weights of 7B/13B resident on a random device.
            t = time.perf_counter()
            models: dict[str, int] = {}  # model_uid -> weight bytes
            resident: dict[str, dict[str, int]] = {}
            ops = i = 0
            while ops < args.operators:
                name = names[i % len(names)]
                tenant, model_id = f"{cluster}-tenant{i // len(names):03d}", name
                device = None if name == "llama2-70b" else device_ids[int(rng.integers(len(device_ids)))]
                for phase in ("prefill", "decode"):
                    g = graphs[(name, phase)]
                    repo.models.import_model(tenant, model_id, g, device_id=device if phase == "prefill" else None)
                    ops += len(g.operators)
                uid = f"{tenant}/{model_id}"
                models[uid] = graphs[(name, "prefill")].bytes_of("weight")
                if device is not None:
                    resident.setdefault(device, {})[uid] = models[uid]
                i += 1
                if i % 5 == 0:
                    print(f"  imported {i} models, {ops} operators ({time.perf_counter() - t:.0f}s)", flush=True)
            repo.cluster.refresh_device_state(cluster)
            import_s = time.perf_counter() - t
            print(f"models: {len(models)} models, {ops} operators, weights on {len(resident)} devices "
                  f"in {import_s:.0f}s", flush=True)

            # Live placements: back-to-back-ish windows from t=0 (gaps ~20 ms, 5-50 ms long), and
            # three done slices before t=0 per device; some depend on a slice of another device.
            t = time.perf_counter()
            model_uids = list(models)
            slices: list[PlacedSlice] = []
            done: dict[str, float | None] = {}
            placements: dict[str, list[Placement]] = {}
            for d in device_ids:
                clock = -0.2
                for j in range(3 + int(rng.integers(args.slices_per_device - 5, args.slices_per_device + 6))):
                    if j == 3:
                        clock = float(rng.uniform(0.0, 0.02))
                    start = clock + float(rng.exponential(0.02))
                    end = start + float(rng.uniform(0.005, 0.05))
                    clock = end
                    uid = f"{d}/s{j}"
                    deps = (slices[int(rng.integers(len(slices)))].uid,) if slices and rng.random() < 0.3 else ()
                    mu = model_uids[int(rng.integers(len(model_uids)))]
                    s = PlacedSlice(uid, mu.split("/")[0], mu, d, start, end, int(rng.uniform(0.1, 2.0) * GB), deps)
                    slices.append(s)
                    if j < 3:
                        done[uid] = None
                    else:
                        placements.setdefault(d, []).append(Placement(start, end, s.resident_bytes))
            repo.slots.place_slices(slices)
            repo.slots.mark_slices_done(done)
            live = sum(len(v) for v in placements.values())
            print(f"slices: {live} live, {len(done)} done in {time.perf_counter() - t:.1f}s", flush=True)

            state = ClusterState(
                cluster, {d.device_id: DeviceView(d.device_id, d.host_id, d.kind, d.mem_bytes) for d in spec.devices},
                {(x.src, x.dst): LinkView(x.gbps, x.latency_us) for x in spec.links},
                {(x.src, x.dst): LinkView(x.gbps, x.latency_us) for x in host_links},
                placements, resident)

            def random_query() -> SlotQuery:
                now = float(rng.uniform(0.0, 0.3))
                a100 = float(rng.uniform(0.005, 0.04))
                deps = [InputDep(device_ids[int(rng.integers(len(device_ids)))], now + float(rng.uniform(-0.02, 0.02)),
                                 int(rng.uniform(1e6, 2e8)))
                        for _ in range(int(rng.choice([0, 1, 2], p=[0.4, 0.4, 0.2])))]
                mu = model_uids[int(rng.integers(len(model_uids)))]
                return SlotQuery(cluster=cluster, tenant_id=mu.split("/")[0], model_uid=mu, now_s=now,
                                 duration_s_by_kind={"A100-80GB": a100, "H100-80GB": 0.6 * a100},
                                 slice_bytes=int(rng.uniform(0.1, 4.0) * GB), weight_bytes=models[mu],
                                 needs_weights=bool(rng.random() < 0.5), input_deps=deps, margin=0.05, k=args.k)

            for _ in range(100):  # warm the plan cache, the page cache and the JIT (as a live service is)
                repo.slots.find_candidate_slots(random_query())
            cypher_ms: list[float] = []
            memory_ms: list[float] = []
            mismatches = 0
            by_deps: dict[int, list[float]] = {}
            for n in range(args.queries):
                q = random_query()
                t0 = time.perf_counter()
                got = repo.slots.find_candidate_slots(q)
                t1 = time.perf_counter()
                want = find_slots_in_memory(state, q)
                t2 = time.perf_counter()
                cypher_ms.append((t1 - t0) * 1e3)
                memory_ms.append((t2 - t1) * 1e3)
                by_deps.setdefault(len(q.input_deps), []).append((t1 - t0) * 1e3)
                same = [s.device_id for s in got] == [s.device_id for s in want] and all(
                    abs(a.start_s - b.start_s) <= 1e-9 and abs(a.headroom_bytes - b.headroom_bytes) <= 1e-6 * GB
                    for a, b in zip(got, want, strict=True))
                mismatches += not same
                if (n + 1) % max(1, args.queries // 5) == 0:
                    print(f"  {n + 1}/{args.queries} queries: cypher p50 {statistics.median(cypher_ms):.2f} ms, "
                          f"p99 {pct(cypher_ms, 99):.2f} ms", flush=True)
            counts = repo.cluster.count_labels()
        finally:
            if info is not None:
                server.stop()

    results = {
        "cypher_p50_ms": round(pct(cypher_ms, 50), 3), "cypher_p90_ms": round(pct(cypher_ms, 90), 3),
        "cypher_p99_ms": round(pct(cypher_ms, 99), 3), "cypher_max_ms": round(max(cypher_ms), 3),
        "cypher_p99_ms_by_num_inputs": {str(k): round(pct(v, 99), 3) for k, v in sorted(by_deps.items())},
        "memory_p50_ms": round(pct(memory_ms, 50), 3), "memory_p99_ms": round(pct(memory_ms, 99), 3),
        "mismatches": mismatches, "target_p99_ms": 20.0, "meets_target": pct(cypher_ms, 99) <= 20.0,
        "import_s": round(import_s, 1),
    }
    config = {
        "hosts": args.hosts, "gpus_per_host": args.gpus_per_host, "devices": len(device_ids),
        "device_links": len(spec.links), "host_links": len(host_links), "models": len(models),
        "operators": ops, "devices_with_weights": len(resident), "live_slices": live, "done_slices": len(done),
        "queries": args.queries, "k": args.k, "neo4j": info.version if info else args.uri,
        "node_counts": {k: counts.get(k, 0) for k in ("Device", "Operator", "Tensor", "Slice")},
        "latency": "wall time of one call, driver session and round trip included",
    }
    _record.write("candidate_slots", args, config, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
