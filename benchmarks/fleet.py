"""fleet: how many GPUs' executors can one service lease to, at lease p99 <= 100 ms?

``slicesched serve`` (one process) on a private Neo4j, and a fleet of simulated executors in
this process (asyncio over loopback, keep-alive connections of their own each, through the lean
HTTP/1.1 client of ``benchmarks/_lean_http.py``: with httpx the simulation took 0.9 cores at 400
GPUs and was the fleet's bottleneck), one per GPU and
``--gpus-per-node`` on a host, each speaking the real protocol: it registers its device,
heartbeats every ``--heartbeat-s`` with the leases it runs, long-polls for as many leases as its
batch has free slots (``--slots``), "runs" each lease for its output tokens times ``--tpot-ms`` without a
model, and posts its completion. Demand is the Azure LLM 2023 conversation trace (read in place
from ``$SLICESCHED_DATA``), its clock sped up so that its mean rate is ``--rps-per-gpu`` times
the fleet's GPUs, submitted in 100 ms batches (``max_tokens`` capped at ``--max-tokens``).

The fleet grows through ``--sizes`` (executors are added to the running service); at each size,
after ``--warmup-s`` (more at the first size), ``--repeats`` windows of ``--duration-s`` are
measured (the lease p99 held is the windows' median): lease latency (from a request's
submission, its batch sent, to its lease in an executor's hands: intake, queue and dispatch)
p50/p99, the submission's round trip (the durable intake commit), heartbeat and completion
latency, leases per second, the GMG write lag the service reports, and the cores the service
and Neo4j kept busy. ``results.max_gpus_p99_le_100ms`` is the largest size held with lease p99
<= 100 ms, every smaller size held too (target >= 1,000 on this 2-core machine); sizes stop
once p99 passes five times the target. ``results.plot``: latencies and rates per size. The fleet's own process shares the cores
with the service and Neo4j: ``cpu_cores.this process`` says how much of the machine the
simulation itself took, and ``client_loop_lag_ms`` how late that process's event loop woke a
task (a probe sleeping 20 ms at a time): each latency above ends with such a delay. The feed starts at a seeded point of the trace and goes on from where
the previous size left it.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

TARGET_P99_S = 0.100
GIVE_UP = 5  # sizes stop once lease p99 passes this many times the target
# `serve`'s third collection threshold (service.api.app.FULL_COLLECTION_AFTER, held equal by
# tests/unit/test_fleet.py), for this process too: not imported, which would load the whole app here
FULL_COLLECTION_AFTER = 1000


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


class Fleet:
    """The simulated executors and their measurements (one window at a time)."""

    def __init__(self, url: str, key: str, *, slots: int, gpus_per_node: int, tpot_s: float,
                 heartbeat_s: float) -> None:
        # connections of its own per executor, as each daemon has its own
        self.url, self.key = url, key
        self.clients: dict[str, Any] = {}
        self.slots, self.gpus_per_node, self.tpot_s, self.heartbeat_s = slots, gpus_per_node, tpot_s, heartbeat_s
        self.names: list[str] = []
        self.running: dict[str, set[str]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.in_flight: set[asyncio.Task[None]] = set()  # leases being "run"
        self.submitted: dict[str, float] = {}  # request id -> when its batch was sent (perf_counter)
        self.leased: dict[str, float] = {}  # request id -> when a poll brought its lease (perf_counter)
        self.stop = asyncio.Event()
        self.reset()

    def client_of(self) -> Any:
        from benchmarks._lean_http import LeanClient

        return LeanClient(self.url, key=self.key, timeout_s=60.0)

    def reset(self) -> None:
        self.measuring = False
        self.leased.clear()
        self.heartbeat_s_lat: list[float] = []
        self.complete_s: list[float] = []
        self.loop_lag_s: list[float] = []
        self.leases = 0
        self.errors = 0

    async def grow(self, gpus: int) -> float:
        """Register executors (one per GPU, ``gpus_per_node`` of them on each host) until the
        fleet has ``gpus`` GPUs, eight hosts' at once (as a node pool comes up); returns the
        seconds registration took."""
        started = time.perf_counter()
        while len(self.names) < gpus:
            first = len(self.names)
            await asyncio.gather(*(self.register(f"n{i // self.gpus_per_node:04d}-g{i % self.gpus_per_node}",
                                                 f"n{i // self.gpus_per_node:04d}")
                                   for i in range(first, min(gpus, first + 8 * self.gpus_per_node))))
        return time.perf_counter() - started

    async def register(self, name: str, host: str) -> None:
        self.clients[name] = self.client_of()
        r = await self.clients[name].post("/v1/executors", json={
            "executor_id": name, "host_id": host,
            "devices": [{"device_id": "gpu:0", "kind": "cpu", "mem_bytes": 4 << 30}]})
        r.raise_for_status()
        self.names.append(name)
        self.running[name] = set()
        self.tasks += [asyncio.create_task(self.poller(name)), asyncio.create_task(self.heartbeater(name))]

    async def poller(self, name: str) -> None:
        running = self.running[name]
        while not self.stop.is_set():
            free = self.slots - len(running)
            if free <= 0:
                await asyncio.sleep(0.01)
                continue
            try:
                r = await self.clients[name].post("/v1/leases/poll", json={"executor_id": name, "max_leases": free,
                                                                    "wait_s": 1.0})
                r.raise_for_status()
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.2)
                continue
            leases = r.json()["leases"]
            if leases and self.measuring:
                now = time.perf_counter()
                self.leased.update((x["request_id"], now) for x in leases)
            for lease in leases:
                running.add(lease["lease_id"])
                task = asyncio.create_task(self.run_lease(name, lease))
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)

    async def run_lease(self, name: str, lease: dict[str, Any]) -> None:
        n = int(lease["max_tokens"])
        await asyncio.sleep(n * self.tpot_s)
        result = {"lease_id": lease["lease_id"], "output_tokens": [0] * n, "queued_s": 0.0, "ttft_s": self.tpot_s,
                  "e2e_s": n * self.tpot_s, "iterations": n, "busy_s": n * self.tpot_s}
        t0 = time.perf_counter()
        try:
            r = await self.clients[name].post("/v1/leases/complete", json={"executor_id": name, "results": [result]})
            r.raise_for_status()
            if self.measuring:
                self.complete_s.append(time.perf_counter() - t0)
                self.leases += 1
        except Exception:
            self.errors += 1
        finally:
            self.running[name].discard(lease["lease_id"])

    async def heartbeater(self, name: str) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(self.heartbeat_s)
            t0 = time.perf_counter()
            try:
                r = await self.clients[name].post(f"/v1/executors/{name}/heartbeat",
                                           json={"running": sorted(self.running[name]), "busy_s": 0.0})
                r.raise_for_status()
                if self.measuring:
                    self.heartbeat_s_lat.append(time.perf_counter() - t0)
            except Exception:
                self.errors += 1

    async def lag_probe(self, period_s: float = 0.02) -> None:
        """How late this process's own event loop wakes a task: every latency measured here
        includes such a delay at its end (the fleet's process shares the cores with the service
        and Neo4j), so the record shows how much of a tail is the simulation's own."""
        while not self.stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(period_s)
            if self.measuring:
                self.loop_lag_s.append(max(0.0, time.perf_counter() - t0 - period_s))

    def lease_latencies(self) -> list[float]:
        """Seconds from a request's submission (its batch sent) to its lease in an executor's hands,
        for the leases of this window. A lease can come back before the submission's answer has been
        read here, so both ends are kept and matched afterwards."""
        return [at - self.submitted[rid] for rid, at in self.leased.items() if rid in self.submitted]

    async def close(self) -> None:
        self.stop.set()
        for t in (*self.tasks, *self.in_flight):
            t.cancel()
        await asyncio.gather(*self.tasks, *self.in_flight, return_exceptions=True)
        await asyncio.gather(*(c.aclose() for c in self.clients.values()), return_exceptions=True)


def conv_arrivals() -> list[tuple[float, int]]:
    """(arrival seconds, output tokens) of the Azure conversation trace, read in place."""
    from service.data import resolve
    from service.workload.readers import read_azure

    reqs = read_azure(resolve("azure-llm-2023/AzureLLMInferenceTrace_conv.csv"), tenant_id="conv", model="m").requests
    return [(r.arrival_s, r.output_tokens) for r in reqs]


class TraceCursor:
    """Where the feed is in the trace (cycling): it starts at a seeded position and goes on from
    where the previous fleet size left it, so every size sees the trace's middle, not its sparse
    first minutes again."""

    def __init__(self, trace: list[tuple[float, int]], seed: int) -> None:
        import random

        self.trace, self.span = trace, trace[-1][0] - trace[0][0]
        self.i, self.offset = random.Random(seed).randrange(len(trace)), 0.0
        self.offset = -(trace[self.i][0] - trace[0][0])  # trace time 0 = the seeded request

    def due(self, now_trace: float, limit: int) -> list[int]:
        """Output tokens of the requests due by ``now_trace`` (trace seconds since the feed began)."""
        out: list[int] = []
        trace = self.trace
        while self.offset + trace[self.i][0] - trace[0][0] <= now_trace and len(out) < limit:
            out.append(trace[self.i][1])
            self.i += 1
            if self.i == len(trace):
                self.i, self.offset = 0, self.offset + self.span
        return out

    def rebase(self) -> None:
        """The next feed's clock starts at the next request."""
        self.offset = -(self.trace[self.i][0] - self.trace[0][0])


async def submit(client: Any, admin_key: str, cursor: TraceCursor, rate: float, max_tokens: int,
                 stop: asyncio.Event, out: dict[str, Any], submitted: dict[str, float]) -> None:
    """The trace's arrivals, its clock sped up so that its mean rate is ``rate`` requests/s, in
    100 ms batches; ``submitted`` gets each request's send time."""
    speed = rate * cursor.span / len(cursor.trace)  # trace seconds per wall second
    cursor.rebase()
    start = time.perf_counter()
    while not stop.is_set():
        now_trace = (time.perf_counter() - start) * speed
        batch = [{"model_id": "m", "prompt_tokens": [1, 2, 3, 4], "tenant_id": "fleet",
                  "max_tokens": max(1, min(max_tokens, n))} for n in cursor.due(now_trace, 1000)]
        if batch:
            sent = time.perf_counter()
            try:
                r = await client.post("/v1/requests/batch", json={"requests": batch},
                                      headers={"Authorization": f"Bearer {admin_key}"})
                r.raise_for_status()
                out["submitted"] += len(batch)
                out["submit_s"].append(time.perf_counter() - sent)
                for item in r.json()["accepted"]:
                    if "request_id" in item:
                        submitted[item["request_id"]] = sent
            except Exception:
                out["submit_errors"] += 1
        await asyncio.sleep(0.1)


async def measure(url: str, admin_key: str, pids: dict[str, int], args: Any) -> dict[str, Any]:
    import httpx

    from service.harness.live_run import CpuMeter

    cursor = TraceCursor(conv_arrivals(), args.seed)
    gc.collect()
    gc.freeze()  # the trace and the imports: a full collection here would pause every simulated executor
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)  # and rare full collections, as `serve` has
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=120.0) as c:
        (await c.post("/v1/tenants", json={"tenant_id": "fleet"})).raise_for_status()
        (await c.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny",
                                                  "tenant_id": "fleet"})).raise_for_status()
        # a pool of its own: the bootstrap pool may register 64 devices; a fleet is a pool of many
        r = await c.post("/v1/executor-pools", json={"pool_id": "fleet", "allowed_kinds": ["cpu"],
                                                     "max_devices": max(args.sizes)})
        r.raise_for_status()
        fleet = Fleet(url, r.json()["api_key"], slots=args.slots, gpus_per_node=args.gpus_per_node, tpot_s=args.tpot_ms / 1e3, heartbeat_s=args.heartbeat_s)
        fleet.tasks.append(asyncio.create_task(fleet.lag_probe()))
        sizes: list[dict[str, Any]] = []
        try:
            for asked in args.sizes:
                register_s = await fleet.grow(asked)
                n = len(fleet.names)
                stop = asyncio.Event()
                counts: dict[str, Any] = {"submitted": 0, "submit_errors": 0, "submit_s": []}
                fed_from = time.perf_counter()
                feeder = asyncio.create_task(submit(c, admin_key, cursor, args.rps_per_gpu * n, args.max_tokens, stop,
                                                    counts, fleet.submitted))
                await asyncio.sleep(args.warmup_s + (args.first_warmup_s if not sizes else 0.0))
                meter = CpuMeter(pids)
                meter.start()
                lease_s: list[float] = []
                heartbeat_s: list[float] = []
                complete_s: list[float] = []
                loop_lag_s: list[float] = []
                window_p99: list[float | None] = []
                leases, errors, window = 0, 0, 0.0
                for _ in range(args.repeats):  # consecutive windows: the p99 held is their median
                    fleet.reset()
                    fleet.measuring = True
                    t0 = time.perf_counter()
                    await asyncio.sleep(args.duration_s)
                    window += time.perf_counter() - t0
                    fleet.measuring = False
                    lats = fleet.lease_latencies()
                    window_p99.append(_ms(pct(lats, 0.99)))
                    lease_s += lats
                    heartbeat_s += fleet.heartbeat_s_lat
                    complete_s += fleet.complete_s
                    loop_lag_s += fleet.loop_lag_s
                    leases, errors = leases + fleet.leases, errors + fleet.errors
                cores = meter.stop()
                stop.set()
                await feeder
                fed_s = time.perf_counter() - fed_from
                stats = (await c.get("/v1/stats")).json()
                measured = [x for x in window_p99 if x is not None]
                p99_ms = statistics.median(measured) if len(measured) == len(window_p99) else None
                row = {"gpus": n, "hosts": -(-n // args.gpus_per_node), "register_s": round(register_s, 2),
                       "window_s": round(window, 2), "leases_per_s": leases / window, "target_rps": args.rps_per_gpu * n,
                       "offered_rps": counts["submitted"] / fed_s, "submitted": counts["submitted"],
                       "submit_errors": counts["submit_errors"], "errors": errors,
                       "service_counters": stats["counters"], "replicas": len(stats["replicas"]),
                       "lease_latency_ms": {"p50": _ms(pct(lease_s, 0.5)), "p99": p99_ms,
                                            "p99_pooled": _ms(pct(lease_s, 0.99)), "p99_per_window": window_p99,
                                            "n": len(lease_s)},
                       "submit_latency_ms": {"p50": _ms(pct(counts["submit_s"], 0.5)),
                                             "p99": _ms(pct(counts["submit_s"], 0.99))},
                       "heartbeat_latency_ms": {"p50": _ms(pct(heartbeat_s, 0.5)), "p99": _ms(pct(heartbeat_s, 0.99))},
                       "complete_latency_ms": {"p50": _ms(pct(complete_s, 0.5)), "p99": _ms(pct(complete_s, 0.99))},
                       "client_loop_lag_ms": {"p50": _ms(pct(loop_lag_s, 0.5)), "p99": _ms(pct(loop_lag_s, 0.99)),
                                              "n": len(loop_lag_s)},
                       "gmg_write_lag_s": stats["gmg_write_lag_s"], "cpu_cores": cores,
                       "held": p99_ms is not None and p99_ms <= 1e3 * TARGET_P99_S}
                sizes.append(row)
                print(f"  {n} GPUs: {row['leases_per_s']:.0f} leases/s (offered {row['offered_rps']:.1f} req/s, the trace's mean {row['target_rps']:.0f}), lease "
                      f"p99 {row['lease_latency_ms']['p99']} ms, heartbeat p99 {row['heartbeat_latency_ms']['p99']} ms, "
                      f"this process's loop lag p99 {row['client_loop_lag_ms']['p99']} ms, "
                      f"cores {cores}", flush=True)
                if p99_ms is None or p99_ms > GIVE_UP * 1e3 * TARGET_P99_S:
                    break  # far past the knee: a bigger fleet only queues longer
        finally:
            await fleet.close()
    held = 0  # the largest size held with every smaller one held too
    for size in sizes:
        if not size["held"]:
            break
        held = size["gpus"]
    by_gpus = {str(r["gpus"]): {"lease_p50_ms": r["lease_latency_ms"]["p50"], "lease_p99_ms": r["lease_latency_ms"]["p99"],
                                "submit_p99_ms": r["submit_latency_ms"]["p99"],
                                "heartbeat_p99_ms": r["heartbeat_latency_ms"]["p99"],
                                "complete_p99_ms": r["complete_latency_ms"]["p99"],
                                "client_loop_lag_p99_ms": r["client_loop_lag_ms"]["p99"], "leases_per_s": r["leases_per_s"],
                                "machine_cores": r["cpu_cores"].get("machine"),
                                "service_cores": r["cpu_cores"].get("service")} for r in sizes}
    return {"max_gpus_p99_le_100ms": held, "target_gpus": 1000, "target": {"met": held >= 1000},
            "by_gpus": by_gpus, "sizes": sizes, "lease_p99_target_ms": 1e3 * TARGET_P99_S}


def _plot(out: Path, sizes: list[dict[str, Any]]) -> str:
    """Lease latency p50/p99, heartbeat and completion p99 and the fleet process's loop lag (left) and leases/s against the trace's rate
    (right) per fleet size: ``fleet/fleet.png`` beside the record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r["gpus"] for r in sizes]
    fig, (lat, rate) = plt.subplots(1, 2, figsize=(10, 4))
    for label, key, q, style in (("lease p50", "lease_latency_ms", "p50", "o-"),
                                 ("lease p99", "lease_latency_ms", "p99", "s-"),
                                 ("heartbeat p99", "heartbeat_latency_ms", "p99", "^--"),
                                 ("completion p99", "complete_latency_ms", "p99", "v:"),
                                 ("the fleet process's loop lag p99", "client_loop_lag_ms", "p99", "d-.")):
        lat.plot(gpus, [r[key][q] for r in sizes], style, label=label)
    lat.axhline(1e3 * TARGET_P99_S, color="grey", lw=0.8, ls="--", label="target (lease p99)")
    lat.set_yscale("log")
    lat.set_xlabel("simulated GPUs (one executor each)")
    lat.set_ylabel("ms")
    lat.legend(fontsize=7)
    rate.plot(gpus, [r["leases_per_s"] for r in sizes], "o-", label="leases/s completed")
    rate.plot(gpus, [r["target_rps"] for r in sizes], "k--", lw=0.8, label="the trace's mean rate")
    rate.plot(gpus, [r["offered_rps"] for r in sizes], "x:", label="offered (the trace's window)")
    rate.set_xlabel("simulated GPUs (one executor each)")
    rate.set_ylabel("per second")
    rate.legend(fontsize=7)
    fig.suptitle("one slicesched serve and its Neo4j on this machine, Azure conv arrivals scaled to the fleet",
                 fontsize=9)
    folder = out / "fleet"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fleet.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.relative_to(out).as_posix()


def _ms(s: float | None) -> float | None:
    return None if s is None else round(1e3 * s, 2)


def main() -> int:
    p = _record.parser("fleet", __doc__.splitlines()[0])
    p.add_argument("--sizes", default="50,100,200,300,400,550,700,1000,1400",
                   help="fleet sizes (GPUs), ascending (between 200 and 700 in steps of about a third, where "
                        "the knee has been: the figure held is one of these)")
    p.add_argument("--duration-s", type=float, default=20.0, help="measured seconds per size")
    p.add_argument("--warmup-s", type=float, default=5.0, help="unmeasured seconds of load at each size")
    p.add_argument("--first-warmup-s", type=float, default=25.0,
                   help="more of them at the first size (Neo4j compiles its queries, the service warms up)")
    p.add_argument("--repeats", type=int, default=3, help="measured windows per size (p99: their median)")
    p.add_argument("--rps-per-gpu", type=float, default=1.4,
                   help="requests per second per GPU (the trace's shape; 1.4: the peer_agreement record's conv "
                        "rate on 4 A100s, per GPU, as docs/scaling.md reckons)")
    p.add_argument("--max-tokens", type=int, default=64, help="cap on a request's output tokens")
    p.add_argument("--tpot-ms", type=float, default=20.0, help="a simulated executor's time per output token")
    p.add_argument("--slots", type=int, default=8, help="leases one simulated GPU runs at once (its batch)")
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="GPUs per host (an executor per GPU: an executor is one scheduling unit; the "
                        "hosts' network links grow with the square of their number)")
    p.add_argument("--heartbeat-s", type=float, default=5.0)
    args = p.parse_args()
    if args.quick:
        args.sizes, args.duration_s, args.warmup_s, args.first_warmup_s = "25,50,100", 6.0, 3.0, 10.0
    args.sizes = [int(x) for x in str(args.sizes).split(",") if x.strip()]
    if args.sizes != sorted(args.sizes) or not args.sizes or args.sizes[0] < 1:
        p.error("--sizes must be ascending positive integers")
    from service.harness.stack import LiveStack

    with LiveStack(lease_ttl_s=60.0, heartbeat_s=args.heartbeat_s, max_batch=args.slots) as stack:
        pids = {"service": stack.server.pid} if stack.server is not None else {}
        try:
            status = stack.local_neo4j.status()
        except RuntimeError:  # a Neo4j the stack did not start
            status = None
        if status is not None:
            pids["neo4j"] = status.pid
        print(f"service at {stack.url}; fleet sizes {args.sizes}", flush=True)
        results = asyncio.run(measure(stack.url, stack.admin_key, pids, args))
    results["plot"] = _plot(args.out, results["sizes"])
    results["median_lease_p99_ms"] = statistics.median(
        [r["lease_latency_ms"]["p99"] for r in results["sizes"] if r["lease_latency_ms"]["p99"] is not None] or [0.0])
    _record.write("fleet", args, {"sizes": args.sizes, "duration_s": args.duration_s, "warmup_s": args.warmup_s,
                                  "first_warmup_s": args.first_warmup_s, "repeats": args.repeats,
                                  "rps_per_gpu": args.rps_per_gpu, "max_tokens": args.max_tokens,
                                  "tpot_ms": args.tpot_ms, "slots": args.slots, "gpus_per_node": args.gpus_per_node, "heartbeat_s": args.heartbeat_s,
                                  "trace": "azure-llm-2023 conv"}, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
