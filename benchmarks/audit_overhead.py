"""audit_overhead: what does the audit log cost the lease path, and how fast does ``audit verify`` walk a long chain?

Part 1, overhead: the lease_throughput workload (``slicesched serve`` on a private Neo4j, 16
simulated executors on loopback, requests submitted up front, a paced and a saturated phase:
benchmarks/lease_throughput.py) run with auditing on and off (``SLICESCHED_AUDIT=1`` / ``0``),
interleaved (on, off, then off, on, ...) after one warm-up run of the same size, on one Neo4j whose live records
are deleted between runs (the audit chain goes on across them). Reported: leases per second of
each run and the medians per mode; ``overhead`` = 1 - median(on) / median(off) in the
saturated phase (a fraction; target <= 0.10), ``overhead_paced`` the same for the paced phase,
and how many audit entries each run wrote (leases are not audited: only registrations, keys and
placement decisions are).

Part 2, verify: a chain of ``--entries`` properly chained entries (a mix of tenant, key, model,
executor and placement-decision entries with notes and what-if figures) appended after the
existing head in ``UNWIND`` batches through the writer's own query, then the whole chain
verified as ``slicesched audit verify`` does. Reported: seconds and entries per second of the
generation and of the verification, and ``verify_1m_s`` (measured with 1,000,000 entries; with
``--quick`` fewer entries, and ``verify_1m_s`` is scaled from the measured rate: verification
is linear in the entries, see ``verify_1m_s_scaled``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record, lease_throughput

MODES = {"on": "1", "off": "0"}
BATCH = 10_000  # entries per UNWIND batch when generating the chain


def one_run(neo4j: Any, repo: Any, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One lease_throughput run with auditing ``mode``; the live records it left are deleted after."""
    import httpx

    from service.harness.stack import LiveStack

    with LiveStack(neo4j=neo4j, lease_ttl_s=30.0, max_batch=args.batch, extra_env={"SLICESCHED_AUDIT": MODES[mode]},
                   log_dir=args.log_dir) as stack:
        out = asyncio.run(lease_throughput.run(stack.url, stack.admin_key, stack.executor_key, args))
        audit = httpx.get(f"{stack.url}/readyz", timeout=30.0).json()["audit"]
    deleted = repo.models.delete_tenant("bench")  # its model, requests and slices: the next service recovers none
    return {"mode": mode, "paced_leases_per_s": out["paced"]["leases_per_s"],
            "saturated_leases_per_s": out["saturated"]["leases_per_s"],
            "lease_p99_ms": out["paced"]["lease_latency_ms"]["p99"], "audit_entries_written": audit["written"],
            "audit_enabled": audit["enabled"], "nodes_deleted_after": deleted, "load_avg_1m": os.getloadavg()[0]}


def overhead(runs: list[dict[str, Any]], repeats: int, args: argparse.Namespace, neo4j: Any,
             repo: Any) -> dict[str, Any]:
    print("warm-up run, as long as the others (not recorded)", flush=True)
    one_run(neo4j, repo, "on", args)
    for r in range(repeats):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            print(f"run {r + 1}/{repeats}, auditing {mode}", flush=True)
            runs.append(one_run(neo4j, repo, mode, args))
    med = {(mode, phase): statistics.median(x[f"{phase}_leases_per_s"] for x in runs if x["mode"] == mode)
           for mode in MODES for phase in ("paced", "saturated")}
    return {"runs": runs,
            "median_leases_per_s": {mode: {phase: med[mode, phase] for phase in ("paced", "saturated")}
                                    for mode in MODES},
            "overhead": 1.0 - med["on", "saturated"] / med["off", "saturated"],
            "overhead_paced": 1.0 - med["on", "paced"] / med["off", "paced"]}


def synthetic_records(n: int, rng: np.random.Generator) -> list[Any]:
    """``n`` audit records shaped like the service's: most are placement decisions (the largest),
    the rest tenant, key, model and executor entries."""
    from service.domain.audit import AuditRecord, json_text

    kinds = rng.choice(4, size=n, p=[0.55, 0.15, 0.15, 0.15])
    out = []
    for i, kind in enumerate(kinds):
        t = f"tenant{i % 97:02d}"
        at = 1.8e9 + i * 0.01
        if kind == 0:
            gain = int(rng.integers(1, 500))
            details = {"policy": "replica", "notes": [f"add {t}/m on exec{i % 16}: +{gain} tokens in 20s"],
                       "num_whatifs": 3, "added": [f"{t}/m@exec{i % 16}/cpu:0"], "drained": [], "skipped": [],
                       "whatifs": [{"model": f"{t}/m", "compute_units": [f"exec{(i + j) % 16}"], "horizon_s": 20.0,
                                    "baseline": {"output_tokens": 1000, "violations_by_model": {f"{t}/m": 1},
                                                 "memory_violations": 0},
                                    "with_change": {"output_tokens": 1000 + gain - j, "violations_by_model": {},
                                                    "memory_violations": 0}, "gain_tokens": gain - j}
                                   for j in range(3)]}
            out.append(AuditRecord(at, "scheduler", "scheduler", "placement.decision", "placement", None, None,
                                   None, None, json_text(details)))
        elif kind == 1:
            out.append(AuditRecord(at, t, "tenant", "tenant.key.rotate", "tenant", t, t,
                                   json_text({"key": "active", "key_fingerprint": f"{i:012x}"}),
                                   json_text({"key": "active", "key_fingerprint": f"{i + 1:012x}"}), None))
        elif kind == 2:
            out.append(AuditRecord(at, t, "tenant", "model.register", "model", f"{t}/m{i}", t, None,
                                   json_text({"family": "tiny", "seed": i, "replicas": 1, "path": None,
                                              "weight_bytes": 4150272}), None))
        else:
            out.append(AuditRecord(at, f"exec{i % 16}", "executor", "executor.register", "executor", f"exec{i % 16}",
                                   None, None, json_text({"host_id": f"h{i % 16}", "stage_url": None, "devices": [
                                       {"device_id": f"exec{i % 16}/cpu:0", "kind": "cpu", "mem_bytes": 2**31}]}),
                                   json_text({"pool": "bootstrap"})))
    return out


def verify_chain(repo: Any, entries: int, rng: np.random.Generator) -> dict[str, Any]:
    """Append ``entries`` chained entries after the head, then verify the whole chain."""
    from service.domain.audit import GENESIS, chain

    head = repo.audit.audit_head()
    seq, digest = (int(head["head_seq"]), str(head["head_hash"])) if head["head_seq"] is not None else (0, GENESIS)
    first = seq
    started = time.perf_counter()
    for i in range(0, entries, BATCH):
        batch = chain(synthetic_records(min(BATCH, entries - i), rng), seq, digest)
        repo.audit.append_audit_entries([{"entry": e.row(), "tenants": [], "models": [], "pools": []} for e in batch],
                                  (batch[-1].seq, batch[-1].hash))
        seq, digest = batch[-1].seq, batch[-1].hash
        print(f"  generated {i + len(batch):,}/{entries:,}", end="\r", flush=True)
    generate_s = time.perf_counter() - started
    print(f"\n  {entries:,} entries appended in {generate_s:.1f}s; verifying {seq:,}", flush=True)
    started = time.perf_counter()
    result = repo.audit.verify_audit(progress=lambda n, s: print(f"  verified {n:,} ({n / max(s, 1e-9):,.0f}/s)",
                                                            end="\r", flush=True))
    verify_s = time.perf_counter() - started
    print(flush=True)
    if not result.ok:
        raise RuntimeError(f"the generated chain does not verify: seq {result.first_bad_seq}: {result.reason}")
    rate = result.entries / verify_s
    return {"entries_generated": entries, "entries_before": first, "entries_verified": result.entries,
            "generate_s": generate_s, "generate_entries_per_s": entries / generate_s, "verify_s": verify_s,
            "verify_entries_per_s": rate, "verify_1m_s": 1_000_000 / rate,
            "verify_1m_s_scaled": result.entries < 1_000_000}


def main() -> int:
    p = _record.parser("audit_overhead", __doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="lease runs per mode (interleaved); 0: the verify part only")
    p.add_argument("--entries", type=int, default=1_000_000, help="audit entries generated for the verify part")
    p.add_argument("--executors", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="leases asked for per poll (the executor's free KV slots)")
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--requests", type=int, default=90_000)
    p.add_argument("--work-ms", type=float, default=80.0, help="paced phase: a simulated batch runs this long")
    p.add_argument("--log-dir", type=Path, help="keep the services' logs here")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.duration_s, args.requests, args.entries = 2, 4.0, 12_000, min(args.entries, 50_000)

    from neo4j import GraphDatabase

    from service.graph.connection import Neo4jSettings
    from service.graph.local_server import LocalNeo4j
    from service.graph.repository import GraphRepository

    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="audit-overhead-") as state:
        server = LocalNeo4j(Path(state), heap="1g", pagecache="512m")
        info = server.start(log=False)
        try:
            user, password = server.auth()
            neo4j = Neo4jSettings(uri=info.uri, user=user, password=password, state_dir=server.state_dir)
            driver = GraphDatabase.driver(info.uri, auth=(user, password))
            repo = GraphRepository(driver)
            repo.apply_schema()
            results: dict[str, Any] = (overhead([], args.repeats, args, neo4j, repo) if args.repeats
                                       else {"overhead": None})
            results["verify"] = verify_chain(repo, args.entries, rng)
            driver.close()
        finally:
            server.stop()
    results["verify_1m_s"] = results["verify"]["verify_1m_s"]
    results["targets"] = {"overhead": 0.10, "met": results["overhead"] is not None and results["overhead"] <= 0.10}
    _record.write("audit_overhead", args, {
        "repeats_per_mode": args.repeats, "executors": args.executors, "batch": args.batch, "work_ms": args.work_ms,
        "duration_s": args.duration_s, "requests": args.requests, "verify_entries": args.entries,
        "verify_entries_note": "fewer than 1,000,000 (--quick): verify_1m_s is scaled from the measured rate"
        if args.entries < 1_000_000 else "1,000,000 entries generated: verify_1m_s is measured"}, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
