"""lease_throughput: how many leases per second does the service grant and complete, and how fast?

``slicesched serve`` (uvicorn, one process) on a private Neo4j; simulated executors on
loopback (asyncio in this process, each with keep-alive connections through the lean HTTP/1.1
client of ``benchmarks/_lean_http.py``, which costs the shared cores far less than httpx did:
they register one device each, long-poll for up to
``--batch`` leases, and complete each batch at once with the right number of tokens, without
running a model). Requests are submitted up front in batches of 1,000 (each written to Neo4j
before it is accepted). Reported: leases completed per second over the measured window, the
latency of a lease (poll round trip while work is queued; per lease) and of a completion post,
p50 and p99, and the GMG write lag the service measured meanwhile. Targets (issue 41): >= 2,000
leases/s saturated and >= 1,400/s paced, lease p99 <= 50 ms, on this 2-core machine.

Every executor is a closed loop, as an executor daemon is: it polls, works ``--work-ms`` (none
when saturated), posts its completion and waits for it to be accepted (durable) before its slots
are free again (the service holds a replica's slots until then). So a phase cannot exceed
executors x batch / (work + lease round trip + completion round trip); ``closed_loop_bound``
reports that bound from the phase's own medians, and ``loop_share`` the measured rate over it.

The paced phase offers the fleet's rate: ``--executors`` (64; a fleet of 1,000 GPUs in 8-GPU
hosts runs 125 executor daemons) simulated executors whose polls a
shared pacer spaces so that together they ask at most ``--paced-leases-per-s`` (1,500: the
1,400/s that 1,000 GPUs of Azure conv traffic ask, docs/scaling.md, with some headroom) leases
per second; a pacer that falls behind does not burst to catch up. Its closed-loop bound is above
the offered rate, so the service's answer times, not the loop, decide whether the rate is carried
(``offered_leases_per_s`` beside ``leases_per_s``; ``--paced-leases-per-s 0`` makes it a bare
closed loop, as records before 2026-12-07 were, with 16 executors and a bound of about 1,070/s).
The saturated phase is a sweep over the executor count
(``--saturated-executors``, each count a phase of its own against the same service, the executors
registered once and reused):
with 16 executors the loop, not the service, sets the rate (the service's event loop was about 30%
busy there). ``saturated`` is the sweep's point with the most leases per second, every point is in
``saturated_sweep``; the simulated executors share the machine's two cores with the service and
Neo4j, so more of them also cost the service CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record


def executor_counts(text: str) -> list[int]:
    """``--saturated-executors``: comma-separated positive counts, at least one."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected at least one count, each >= 1, got {text!r}")
    return counts


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def ran_dry(points: list[dict[str, Any]]) -> list[int]:
    """The executor counts of the phases that ended with no request left queued: their rate was
    bounded by the backlog, not by the service (such a record would be wrong, so none is written)."""
    return [x["executors"] for x in points if x["backlog_left"] <= 0]


class Pacer:
    """Spaces the polls of every executor of a phase so that together they ask at most ``rate``
    leases per second. A slot in the past is not made up: after a slow answer the pacer resumes
    from now, it does not burst."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.next_s = time.perf_counter()

    async def take(self, leases: int) -> None:
        now = time.perf_counter()
        at = max(now, self.next_s)
        self.next_s = at + leases / self.rate
        if at > now:
            await asyncio.sleep(at - now)


async def executor(url: str, key: str, name: str, batch: int, work_s: float, until: float, measure_from: float,
                   out: dict[str, Any], pacer: Pacer | None = None) -> None:
    from benchmarks._lean_http import LeanClient

    c = LeanClient(url, key=key, timeout_s=30.0)
    try:
        while time.perf_counter() < until:
            if pacer is not None:
                await pacer.take(batch)
            t0 = time.perf_counter()
            r = await c.post("/v1/leases/poll", json={"executor_id": name, "max_leases": batch, "wait_s": 1.0})
            t1 = time.perf_counter()
            r.raise_for_status()
            leases = r.json()["leases"]
            if not leases:
                continue
            out["taken"] += len(leases)
            await asyncio.sleep(work_s)  # the batch "runs"
            sent = time.perf_counter()
            results = [{"lease_id": x["lease_id"], "output_tokens": [0] * x["max_tokens"], "queued_s": 0.0,
                        "ttft_s": 0.001, "e2e_s": 0.002, "iterations": x["max_tokens"], "busy_s": 0.001}
                       for x in leases]
            r = await c.post("/v1/leases/complete", json={"executor_id": name, "results": results})
            t2 = time.perf_counter()
            r.raise_for_status()
            accepted = len(r.json()["accepted"])
            if t0 >= measure_from:
                out["lease_latency_s"].extend([t1 - t0] * len(leases))
                out["complete_latency_s"].append(t2 - sent)
                out["completed"] += accepted
                out["rejected"] += len(leases) - accepted
    finally:
        await c.aclose()


async def run(url: str, key: str, executor_key: str, args: Any) -> dict[str, Any]:
    """``key`` is the admin key; the simulated executors use ``executor_key`` (their pool's)."""
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120.0) as c:
        (await c.post("/v1/tenants", json={"tenant_id": "bench"})).raise_for_status()
        if args.quota_tokens_per_s is not None:  # admission then runs the quota path on every request
            (await c.put("/v1/tenants/bench/quota", json={"tokens_per_s": args.quota_tokens_per_s})).raise_for_status()
        (await c.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny", "tenant_id": "bench"})).raise_for_status()
        submitted, taken, submit_s = 0, 0, 0.0

        async def top_up() -> None:
            """Queue requests until ``args.requests`` wait unleased: every phase starts with that
            backlog, so a fast phase does not leave the next one short of work."""
            nonlocal submitted, submit_s
            want = args.requests - (submitted - taken)
            t = time.perf_counter()
            for i in range(0, want, 1000):
                n = min(1000, want - i)
                body = {"requests": [{"model_id": "m", "prompt_tokens": [1, 2, 3, 4], "max_tokens": 4,
                                      "tenant_id": "bench"} for _ in range(n)]}
                (await c.post("/v1/requests/batch", json=body)).raise_for_status()
                submitted += n
                print(f"  submitted {i + n}/{want}", end="\r", flush=True)
            if want > 0:
                took = time.perf_counter() - t
                submit_s += took
                print(f"\n  {want} requests accepted in {took:.1f}s ({want / took:.0f}/s)", flush=True)

        registered = 0
        phases: dict[str, Any] = {}
        sweep: list[dict[str, Any]] = []
        plan = [("paced", args.executors, args.work_ms)] + [("saturated", n, 0.0) for n in args.saturated_executors]
        for phase, executors, work_ms in plan:
            for i in range(registered, executors):  # one device each; registered once, reused by later phases
                (await c.post("/v1/executors", json={"executor_id": f"sim{i:02d}", "host_id": f"sim{i:02d}",
                                                     "devices": [{"device_id": "cpu:0", "mem_bytes": 4 << 30}]},
                              headers={"Authorization": f"Bearer {executor_key}"})).raise_for_status()
            registered = max(registered, executors)
            await top_up()
            out: dict[str, Any] = {"lease_latency_s": [], "complete_latency_s": [], "completed": 0, "rejected": 0,
                                   "taken": 0}
            start = time.perf_counter()
            measure_from = start + args.warmup_s
            until = measure_from + args.duration_s
            rate = args.paced_leases_per_s if phase == "paced" and args.paced_leases_per_s > 0 else None
            pacer = Pacer(rate) if rate is not None else None
            await asyncio.gather(*(executor(url, executor_key, f"sim{i:02d}", args.batch, work_ms / 1e3, until,
                                            measure_from, out, pacer)
                                   for i in range(executors)))
            window = time.perf_counter() - measure_from
            taken += out["taken"]
            lat, comp = out["lease_latency_s"], out["complete_latency_s"]
            point = {
                "executors": executors, "work_ms_per_batch": work_ms, "offered_leases_per_s": rate,
                "leases_per_s": out["completed"] / window,
                "leases_completed": out["completed"], "completions_rejected": out["rejected"], "window_s": window,
                "lease_latency_ms": {"p50": 1e3 * pct(lat, 0.5), "p99": 1e3 * pct(lat, 0.99),
                                     "mean": 1e3 * statistics.fmean(lat)},
                "complete_latency_ms": {"p50": 1e3 * pct(comp, 0.5), "p99": 1e3 * pct(comp, 0.99)},
                # requests still queued when the phase ended: 0 would mean it ran out of work
                "backlog_left": submitted - taken,
            }
            cycle_s = (work_ms + point["lease_latency_ms"]["p50"] + point["complete_latency_ms"]["p50"]) / 1e3
            point["closed_loop_bound"] = executors * args.batch / cycle_s
            point["loop_share"] = point["leases_per_s"] / point["closed_loop_bound"]
            offered = f", offered {rate:.0f}/s" if rate is not None else ""
            print(f"  {phase} ({executors} executors{offered}): {point['leases_per_s']:.0f} leases/s (closed-loop bound "
                  f"{point['closed_loop_bound']:.0f}), lease p50 {point['lease_latency_ms']['p50']:.1f} ms p99 "
                  f"{point['lease_latency_ms']['p99']:.1f} ms", flush=True)
            if phase == "paced":
                phases["paced"] = point
            else:
                sweep.append(point)
        dry = ran_dry([phases["paced"], *sweep])
        if dry:
            raise SystemExit(f"phases with {dry} executors ran out of queued requests: raise --requests")
        phases["saturated"] = max(sweep, key=lambda x: x["leases_per_s"])
        phases["saturated_sweep"] = sweep
        stats = (await c.get("/v1/stats")).json()
        waited = time.perf_counter()
        while stats["gmg_write_lag_s"]["pending"] and time.perf_counter() - waited < 120:
            await asyncio.sleep(1.0)  # let the GMG writer catch up, then read its lag
            stats = (await c.get("/v1/stats")).json()
            print(f"  GMG writer: {stats['gmg_write_lag_s']['rows']} rows written, "
                  f"{stats['gmg_write_lag_s']['pending']} pending", flush=True)
        catch_up_s = time.perf_counter() - waited
    return {**phases, "requests_submitted": submitted, "submit_requests_per_s": submitted / submit_s, "gmg_write_lag_s": stats["gmg_write_lag_s"],
            "gmg_catch_up_s_after_load": catch_up_s, "service_counters": stats["counters"]}


def main() -> int:
    p = _record.parser("lease_throughput", __doc__.splitlines()[0])
    p.add_argument("--executors", type=int, default=64, help="simulated executors of the paced phase")
    p.add_argument("--paced-leases-per-s", type=float, default=1500.0,
                   help="paced phase: the lease rate the executors offer together (0: a bare closed loop)")
    p.add_argument("--batch", type=int, default=8, help="leases asked for per poll (the executor's free KV slots)")
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--saturated-executors", type=executor_counts,
                   default=[16, 32, 64], help="executor counts of the saturated sweep (comma-separated)")
    p.add_argument("--requests", type=int, default=120_000,
                   help="the backlog each phase starts with (queued requests, topped up before each): more than "
                        "a phase can lease (22 s at 5,000/s), so that none runs out of work")
    p.add_argument("--work-ms", type=float, default=80.0,
                   help="paced phase: a simulated executor runs each batch this long before completing it")
    p.add_argument("--log-dir", type=Path, help="keep the service's log here")
    p.add_argument("--quota-tokens-per-s", type=float,
                   help="give the tenant a tokens/s quota (large enough to refuse nothing: what admission costs "
                        "with quotas on); default none")
    p.add_argument("--quota-pairs", type=int, default=0,
                   help="instead: this many interleaved pairs of runs, quotas off then on (a tokens/s quota of "
                        "1e9 on the tenant), each a fresh service; reports medians side by side")
    args = p.parse_args()
    if args.executors < 1 or args.paced_leases_per_s < 0:
        p.error("--executors must be >= 1 and --paced-leases-per-s >= 0")
    if args.quick:
        args.duration_s, args.requests = 6.0, 40_000
    if args.quota_pairs > 0:
        return quota_pairs(args)
    results = one_run(args, args.quota_tokens_per_s)
    _record.write("lease_throughput", args, {"executors": args.executors, "paced_leases_per_s": args.paced_leases_per_s,
                                             "saturated_executors": args.saturated_executors,
                                             "batch": args.batch, "work_ms": args.work_ms,
                                             "duration_s": args.duration_s, "requests": args.requests,
                                             "quota_tokens_per_s": args.quota_tokens_per_s}, results)
    return 0


def one_run(args: Any, quota_tokens_per_s: float | None) -> dict[str, Any]:
    from service.harness.stack import LiveStack

    args.quota_tokens_per_s = quota_tokens_per_s
    # One replica per executor device: the model's weight decides nothing here; max_batch caps leases per replica.
    with LiveStack(lease_ttl_s=30.0, max_batch=args.batch, log_dir=args.log_dir) as stack:
        print(f"service at {stack.url}; {args.executors} simulated executors"
              + (f"; tokens/s quota {quota_tokens_per_s:g}" if quota_tokens_per_s is not None else "; no quota"),
              flush=True)
        results = asyncio.run(run(stack.url, stack.admin_key, stack.executor_key, args))
    paced, saturated = results["paced"], results["saturated"]
    checks = {"saturated_leases_per_s_ge_2000": saturated["leases_per_s"] >= 2000,
              "paced_lease_p99_le_50ms": paced["lease_latency_ms"]["p99"] <= 50,
              "paced_leases_per_s_ge_1400": paced["leases_per_s"] >= 1400}
    results["targets"] = {"saturated_leases_per_s": 2000, "paced_leases_per_s": 1400, "lease_p99_ms": 50,
                          **checks, "met": all(checks.values())}
    return results


def quota_pairs(args: Any) -> int:
    """Quotas off, then on, ``--quota-pairs`` times (interleaved, so drift on a shared machine hits
    both sides alike); medians of each figure, and on/off ratios."""
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(args.quota_pairs):
        for side, quota in (("off", None), ("on", 1e9)):
            print(f"== pair {i + 1}/{args.quota_pairs}, quotas {side}", flush=True)
            runs[side].append(one_run(args, quota))

    def med(side: str, phase: str, *key: str) -> float:
        values = []
        for r in runs[side]:
            v: Any = r[phase]
            for k in key:
                v = v[k]
            values.append(float(v))
        return statistics.median(values)

    summary: dict[str, Any] = {}
    for phase in ("paced", "saturated"):
        summary[phase] = {side: {"leases_per_s": med(side, phase, "leases_per_s"),
                                 "lease_p50_ms": med(side, phase, "lease_latency_ms", "p50"),
                                 "lease_p99_ms": med(side, phase, "lease_latency_ms", "p99")} for side in runs}
        summary[phase]["on_over_off"] = summary[phase]["on"]["leases_per_s"] / summary[phase]["off"]["leases_per_s"]
        summary[phase]["per_pair_leases_per_s"] = {side: [r[phase]["leases_per_s"] for r in rs]
                                                   for side, rs in runs.items()}
    on = summary["paced"]["on"]
    results = {"quotas": summary, "targets": {
        "leases_per_s": 1000, "lease_p99_ms": 50,
        "met_with_quotas": on["leases_per_s"] >= 1000 and on["lease_p99_ms"] <= 50,
        "met_without": summary["paced"]["off"]["leases_per_s"] >= 1000 and summary["paced"]["off"]["lease_p99_ms"] <= 50}}
    for phase in ("paced", "saturated"):
        print(f"{phase}: off {summary[phase]['off']['leases_per_s']:.0f} leases/s, on "
              f"{summary[phase]['on']['leases_per_s']:.0f} ({summary[phase]['on_over_off']:.2f}x)", flush=True)
    _record.write("lease_throughput-quotas", args, {
        "executors": args.executors, "batch": args.batch, "work_ms": args.work_ms, "duration_s": args.duration_s,
        "requests": args.requests, "pairs": args.quota_pairs, "quota_tokens_per_s": 1e9}, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
