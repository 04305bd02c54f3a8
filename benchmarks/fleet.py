"""fleet: how many GPUs' executors can one service lease to, at lease p99 <= 100 ms?

``slicesched serve`` (one process) on a private Neo4j, and a fleet of simulated executors in
this process (asyncio + httpx over loopback), each speaking the real protocol: it registers one
device, heartbeats every ``--heartbeat-s`` with the leases it runs, long-polls for as many leases
as it has free slots, "runs" each lease for its output tokens times ``--tpot-ms`` without a
model, and posts its completion. Demand is the Azure LLM 2023 conversation trace (read in place
from ``$SLICESCHED_DATA``), its clock sped up so that its mean rate is ``--rps-per-gpu`` times
the fleet's GPUs, submitted in 100 ms batches (``max_tokens`` capped at ``--max-tokens``).

The fleet grows through ``--sizes`` (executors are added to the running service); at each size,
after ``--warmup-s``, ``--duration-s`` of load is measured: lease latency (a poll's round trip
when it returns leases) p50/p99, heartbeat latency p50/p99, completion latency, leases per
second, the GMG write lag the service reports, and the cores the service and Neo4j kept busy.
``results.max_gpus_p99_le_100ms`` is the largest size held with lease p99 <= 100 ms (target
>= 1,000 on this 2-core machine). The fleet's own process shares the cores with the service and
Neo4j: ``cpu_cores.this process`` says how much of the machine the simulation itself took.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

TARGET_P99_S = 0.100


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


class Fleet:
    """The simulated executors and their measurements (one window at a time)."""

    def __init__(self, url: str, key: str, *, slots: int, tpot_s: float, heartbeat_s: float) -> None:
        import httpx

        self.client = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
        self.slots, self.tpot_s, self.heartbeat_s = slots, tpot_s, heartbeat_s
        self.names: list[str] = []
        self.running: dict[str, set[str]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.in_flight: set[asyncio.Task[None]] = set()  # leases being "run"
        self.submitted: dict[str, float] = {}  # request id -> when its batch was answered (perf_counter)
        self.stop = asyncio.Event()
        self.reset()

    def reset(self) -> None:
        self.measuring = False
        self.lease_s: list[float] = []
        self.heartbeat_s_lat: list[float] = []
        self.complete_s: list[float] = []
        self.leases = 0
        self.errors = 0

    async def grow(self, n: int) -> float:
        """Register executors until there are ``n``; returns the seconds registration took."""
        started = time.perf_counter()
        while len(self.names) < n:
            name = f"f{len(self.names):04d}"
            r = await self.client.post("/v1/executors", json={
                "executor_id": name, "host_id": name, "devices": [{"device_id": "gpu:0", "kind": "cpu",
                                                                   "mem_bytes": 4 << 30}]})
            r.raise_for_status()
            self.names.append(name)
            self.running[name] = set()
            self.tasks += [asyncio.create_task(self.poller(name)), asyncio.create_task(self.heartbeater(name))]
        return time.perf_counter() - started

    async def poller(self, name: str) -> None:
        running = self.running[name]
        while not self.stop.is_set():
            free = self.slots - len(running)
            if free <= 0:
                await asyncio.sleep(0.01)
                continue
            t0 = time.perf_counter()
            try:
                r = await self.client.post("/v1/leases/poll", json={"executor_id": name, "max_leases": free,
                                                                    "wait_s": 1.0})
                r.raise_for_status()
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.2)
                continue
            leases = r.json()["leases"]
            if leases and self.measuring:
                now = time.perf_counter()
                self.lease_s.extend(now - self.submitted.get(x["request_id"], t0) for x in leases)
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
            r = await self.client.post("/v1/leases/complete", json={"executor_id": name, "results": [result]})
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
                r = await self.client.post(f"/v1/executors/{name}/heartbeat",
                                           json={"running": sorted(self.running[name]), "busy_s": 0.0})
                r.raise_for_status()
                if self.measuring:
                    self.heartbeat_s_lat.append(time.perf_counter() - t0)
            except Exception:
                self.errors += 1

    async def close(self) -> None:
        self.stop.set()
        for t in (*self.tasks, *self.in_flight):
            t.cancel()
        await asyncio.gather(*self.tasks, *self.in_flight, return_exceptions=True)
        await self.client.aclose()


def conv_arrivals() -> list[tuple[float, int]]:
    """(arrival seconds, output tokens) of the Azure conversation trace, read in place."""
    from service.data import resolve
    from service.workload.readers import read_azure

    reqs = read_azure(resolve("azure-llm-2023/AzureLLMInferenceTrace_conv.csv"), tenant_id="conv", model="m").requests
    return [(r.arrival_s, r.output_tokens) for r in reqs]


async def submit(client: Any, admin_key: str, trace: list[tuple[float, int]], rate: float, max_tokens: int,
                 stop: asyncio.Event, out: dict[str, int], submitted: dict[str, float]) -> None:
    """The trace's arrivals, its clock sped up to ``rate`` requests/s, in 100 ms batches (cycling)."""
    span = trace[-1][0] - trace[0][0]
    speed = rate * span / len(trace)  # trace seconds per wall second
    start, i, offset = time.perf_counter(), 0, 0.0
    while not stop.is_set():
        now_trace = (time.perf_counter() - start) * speed
        batch: list[dict[str, Any]] = []
        while offset + trace[i][0] - trace[0][0] <= now_trace and len(batch) < 1000:
            batch.append({"model_id": "m", "prompt_tokens": [1, 2, 3, 4], "tenant_id": "fleet",
                          "max_tokens": max(1, min(max_tokens, trace[i][1]))})
            i += 1
            if i == len(trace):
                i, offset = 0, offset + span
        if batch:
            try:
                r = await client.post("/v1/requests/batch", json={"requests": batch},
                                      headers={"Authorization": f"Bearer {admin_key}"})
                r.raise_for_status()
                out["submitted"] += len(batch)
                at = time.perf_counter()
                for item in r.json()["accepted"]:
                    if "request_id" in item:
                        submitted[item["request_id"]] = at
            except Exception:
                out["submit_errors"] += 1
        await asyncio.sleep(0.1)


async def measure(url: str, admin_key: str, executor_key: str, pids: dict[str, int], args: Any) -> dict[str, Any]:
    import httpx

    from service.harness.live_run import CpuMeter

    trace = conv_arrivals()
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=120.0) as c:
        (await c.post("/v1/tenants", json={"tenant_id": "fleet"})).raise_for_status()
        (await c.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny",
                                                  "tenant_id": "fleet"})).raise_for_status()
        fleet = Fleet(url, executor_key, slots=args.slots, tpot_s=args.tpot_ms / 1e3, heartbeat_s=args.heartbeat_s)
        sizes: list[dict[str, Any]] = []
        try:
            for n in args.sizes:
                register_s = await fleet.grow(n)
                stop, counts = asyncio.Event(), {"submitted": 0, "submit_errors": 0}
                fed_from = time.perf_counter()
                feeder = asyncio.create_task(submit(c, admin_key, trace, args.rps_per_gpu * n, args.max_tokens, stop,
                                                    counts, fleet.submitted))
                await asyncio.sleep(args.warmup_s)
                fleet.reset()
                fleet.measuring = True
                meter = CpuMeter(pids)
                meter.start()
                t0 = time.perf_counter()
                await asyncio.sleep(args.duration_s)
                window = time.perf_counter() - t0
                fleet.measuring = False
                cores = meter.stop()
                stop.set()
                await feeder
                fed_s = time.perf_counter() - fed_from
                stats = (await c.get("/v1/stats")).json()
                p99 = pct(fleet.lease_s, 0.99)
                row = {"gpus": n, "register_s": round(register_s, 2), "window_s": round(window, 2),
                       "leases_per_s": fleet.leases / window, "target_rps": args.rps_per_gpu * n,
                       "offered_rps": counts["submitted"] / fed_s, "submitted": counts["submitted"], "submit_errors": counts["submit_errors"],
                       "errors": fleet.errors, "service_counters": stats["counters"], "replicas": len(stats["replicas"]),
                       "lease_latency_ms": {"p50": _ms(pct(fleet.lease_s, 0.5)), "p99": _ms(p99)},
                       "heartbeat_latency_ms": {"p50": _ms(pct(fleet.heartbeat_s_lat, 0.5)),
                                                "p99": _ms(pct(fleet.heartbeat_s_lat, 0.99))},
                       "complete_latency_ms": {"p50": _ms(pct(fleet.complete_s, 0.5)),
                                               "p99": _ms(pct(fleet.complete_s, 0.99))},
                       "gmg_write_lag_s": stats["gmg_write_lag_s"], "cpu_cores": cores,
                       "held": p99 is not None and p99 <= TARGET_P99_S}
                sizes.append(row)
                print(f"  {n} GPUs: {row['leases_per_s']:.0f} leases/s (offered {row['offered_rps']:.1f} req/s, the trace's mean {row['target_rps']:.0f}), lease "
                      f"p99 {row['lease_latency_ms']['p99']} ms, heartbeat p99 {row['heartbeat_latency_ms']['p99']} ms, "
                      f"cores {cores}", flush=True)
                if not row["held"]:
                    break
        finally:
            await fleet.close()
    held = [r["gpus"] for r in sizes if r["held"]]
    return {"max_gpus_p99_le_100ms": max(held) if held else 0, "target_gpus": 1000,
            "sizes": sizes, "lease_p99_target_ms": 1e3 * TARGET_P99_S}


def _ms(s: float | None) -> float | None:
    return None if s is None else round(1e3 * s, 2)


def main() -> int:
    p = _record.parser("fleet", __doc__.splitlines()[0])
    p.add_argument("--sizes", default="50,100,200,400,700,1000,1400", help="fleet sizes (GPUs), ascending")
    p.add_argument("--duration-s", type=float, default=20.0, help="measured seconds per size")
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--rps-per-gpu", type=float, default=0.2, help="requests per second per GPU (the trace's shape)")
    p.add_argument("--max-tokens", type=int, default=64, help="cap on a request's output tokens")
    p.add_argument("--tpot-ms", type=float, default=20.0, help="a simulated executor's time per output token")
    p.add_argument("--slots", type=int, default=8, help="leases one simulated executor runs at once")
    p.add_argument("--heartbeat-s", type=float, default=5.0)
    args = p.parse_args()
    if args.quick:
        args.sizes, args.duration_s, args.warmup_s = "25,50,100", 6.0, 3.0
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
        results = asyncio.run(measure(stack.url, stack.admin_key, stack.executor_key, pids, args))
    results["median_lease_p99_ms"] = statistics.median(
        [r["lease_latency_ms"]["p99"] for r in results["sizes"] if r["lease_latency_ms"]["p99"] is not None] or [0.0])
    _record.write("fleet", args, {"sizes": args.sizes, "duration_s": args.duration_s, "warmup_s": args.warmup_s,
                                  "rps_per_gpu": args.rps_per_gpu, "max_tokens": args.max_tokens,
                                  "tpot_ms": args.tpot_ms, "slots": args.slots, "heartbeat_s": args.heartbeat_s,
                                  "trace": "azure-llm-2023 conv"}, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
