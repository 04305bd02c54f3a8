"""Serve a synthetic multi-tenant workload on the live stack and measure it.

:func:`run_live` starts ``slicesched serve`` with one placement policy and two executor
daemons (``--devices cpu:0,cpu:1`` each), registers the tenants and their models, submits the
workload's requests at their arrival times (a client thread per tenant, over HTTP, with the
tenant's own key), waits for every request to finish, and summarises what the service
recorded: output tokens per second over the run, SLA violations, TTFT and end-to-end p50/p99
per tenant, the GMG write lag and the scheduler's decisions. The demo and the ``live_e2e``
benchmark both run it once per placement, on the same workload.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from service.domain.request import RequestStatus, Workload
from service.graph.connection import Neo4jSettings
from service.harness.capacity import busy_share_since, cpu_jiffies, load_scale, machine_speed
from service.harness.live_tenants import register, reset_tenants
from service.harness.stack import LiveStack
from service.harness.timeline import DeviceTimeline, collect_timeline, plot_timelines
from service.live.metrics import sla_met
from service.live.records import LiveRequest
from service.workload.synthetic import TenantLoad, synthetic_workload

# Three tenants on two executors x two CPU "devices": a busy, bursty interactive tenant on a model
# that is slow on a CPU (it gets two devices of one executor under container placement), and two
# light tenants sharing the other executor, which therefore has idle time to lend.
DEMO_TENANTS = (
    TenantLoad("acme", "small-llama", 6.0, "interactive", "gamma", 2.0, prompt_median_tokens=24, prompt_sigma=0.5,
               prompt_max_tokens=128, output_median_tokens=32, output_sigma=0.5, output_max_tokens=128),
    TenantLoad("globex", "tiny-llama", 1.0, "standard", "poisson", prompt_median_tokens=32, prompt_sigma=0.5,
               prompt_max_tokens=128, output_median_tokens=64, output_sigma=0.5, output_max_tokens=256),
    TenantLoad("initech", "tiny", 0.5, "batch", "gamma", 2.0, prompt_median_tokens=48, prompt_sigma=0.5,
               prompt_max_tokens=128, output_median_tokens=64, output_sigma=0.5, output_max_tokens=256),
)


def demo_workload(seed: int, duration_s: float, tenants: Sequence[TenantLoad] = DEMO_TENANTS) -> Workload:
    """The three tenants' requests over ``duration_s`` (the fixed mix, or loads sized by
    :func:`service.harness.capacity.calibrate`)."""
    return synthetic_workload(np.random.default_rng(seed), tenants=tenants, duration_s=duration_s)


@dataclass
class TenantSummary:
    tenant_id: str
    requests: int
    output_tokens: int
    sla_violations: int
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float


@dataclass
class LiveRunResult:
    placement: str
    wall_s: float  # first arrival to last completion
    output_tokens: int
    tokens_per_s: float
    sla_violation_rate: float
    tenants: list[TenantSummary]
    gmg_write_lag_s: dict[str, Any]
    counters: dict[str, int]
    decisions: list[str] = field(default_factory=list)
    guest_replicas: int = 0
    unfinished: int = 0
    scheduler_steps: int = 0
    scheduler_cpu_s: float = 0.0  # wall time the scheduler's steps took (what-ifs included)
    cpu_cores: dict[str, float] = field(default_factory=dict)  # cores each part kept busy (CpuMeter)
    machine_speed: float | None = None  # matrix products/s just before the arrivals (capacity.machine_speed)
    load_scale: float = 1.0  # the factor the arrival rates were scaled by (capacity.load_scale), 1.0: as given
    sliced_guests: int = 0  # sliced guests the scheduler placed (placement slice)
    good_tokens_per_s: float = 0.0  # output tokens of the requests that met their SLA, per second
    started_wall: float = 0.0  # epoch seconds of the first arrival (the run's observations are the GMG's since)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)  # per device: DeviceTimeline.summary()
    timeline: DeviceTimeline | None = field(default=None, repr=False)  # its leases (live_timeline.png)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        out = asdict(replace(self, timeline=None))
        del out["timeline"]
        return out


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (None where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """How many cores each part of the live stack kept busy between :meth:`start` and
    :meth:`stop`: the service, Neo4j and each executor (their processes), this process (the
    load's clients and the run's polling) and the whole machine (/proc/stat). On a machine of few
    cores these share the cores: an executor's idle time is not an idle core while Neo4j and the
    service are busy, which bounds what a guest replica there can add. Linux only (``{}``
    elsewhere); a part whose process cannot be read is left out."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._t0 = 0.0
        self._marks: dict[str, float] = {}
        self._machine: tuple[int, int] | None = None

    def _read(self) -> dict[str, float]:
        out = {name: cpu for name, pid in self.pids.items() if (cpu := _proc_cpu_s(pid)) is not None}
        out["this process (clients)"] = time.process_time()
        return out

    def start(self) -> None:
        self._t0, self._marks, self._machine = time.monotonic(), self._read(), cpu_jiffies()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._t0
        now, share = self._read(), busy_share_since(self._machine)
        if wall <= 0 or not os.path.exists("/proc/stat"):
            return {}
        cores = {name: round((now[name] - t0) / wall, 3) for name, t0 in self._marks.items() if name in now}
        if share is not None:
            cores["machine"] = round(share * (os.cpu_count() or 1), 3)
        return cores


def stack_pids(stack: LiveStack, neo4j: Neo4jSettings | None) -> dict[str, int]:
    """The processes of a live stack by part: the service, each executor, the managed Neo4j."""
    pids = {name: proc.pid for name, proc in sorted(stack.executors.items())}
    if stack.server is not None:
        pids["service"] = stack.server.pid
    if neo4j is not None:  # the managed server's process, when it is the one these settings reach
        from service.graph.local_server import LocalNeo4j

        info = LocalNeo4j(neo4j.state_dir).status()
        if info is not None and (neo4j.uri is None or neo4j.uri == info.uri):
            pids["neo4j"] = info.pid
    return pids


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_live(placement: str, workload: Workload, *, neo4j: Neo4jSettings | None = None, seed: int = 0,
             progress: Callable[[str], None] | None = None, drain_timeout_s: float = 300.0,
             weights: Mapping[str, float] | None = None, probe_speed: float | None = None,
             pace: float | None = None) -> LiveRunResult:
    """Serve ``workload`` live with ``placement``; ``weights`` (tenant -> its share of the offered
    work) size container homes, as a real operator sizes containers from the load it expects.

    With ``probe_speed`` (the machine's speed when the load was calibrated), the machine's speed is
    read again just before the arrivals, and when it drifted past
    :data:`~service.harness.capacity.SPEED_DRIFT` the same requests arrive that much faster or slower
    (:func:`~service.harness.capacity.load_scale`): a shared host's speed drifts between the probe and
    the run, and a load sized on a fast spell is one no placement serves on a slow one. ``pace``
    imposes the factor instead (the speed is still read and recorded): a comparison's later runs
    take its first run's, so that every placement is offered the same rates."""
    say = progress or (lambda _: None)
    tenants = {r.tenant_id: r for r in workload.requests}
    if neo4j is not None:  # a shared graph: start from none of these tenants' objects
        reset_tenants(neo4j, sorted(tenants))
    loads = [TenantLoad(t, r.model, 0.0, r.sla_class) for t, r in sorted(tenants.items())]
    with LiveStack(placement=placement, neo4j=neo4j, lease_ttl_s=10.0, heartbeat_s=1.0) as stack:
        keys = register(stack, loads, weights)
        with stack.client(timeout_s=120.0) as admin:
            stack.start_executor("exec-a", ["cpu:0", "cpu:1"])
            stack.start_executor("exec-b", ["cpu:0", "cpu:1"])
            stack.wait_devices(4)
            say(f"{placement}: API at {stack.url}, 2 executors x 2 devices, {len(tenants)} tenants")
            warm = warm_up(stack.url, keys, say)
            speed = round(machine_speed(), 1) if probe_speed is not None else None
            scale = pace if pace is not None else load_scale(probe_speed, speed)
            if scale != 1.0:
                why = "the comparison's pace, set at its first run" if pace is not None else \
                    f"the machine's speed {speed} against {probe_speed} matrix products/s at the probe"
                say(f"{placement}: arrival rates x{scale:.2f} ({why})")

            def ours(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                """The workload's requests: not the warm-up's, nor other tenants' in a shared graph."""
                return [r for r in rows if r["tenant_id"] in tenants and r["request_id"] not in warm]
            ids: dict[str, list[str]] = {t: [] for t in tenants}
            rng = np.random.default_rng(seed)
            start, since_wall = time.monotonic() + 0.5, time.time() + 0.5

            def client(tenant: str) -> None:
                with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {keys[tenant]}"},
                                  timeout=60.0) as c:
                    for req in workload.requests:
                        if req.tenant_id != tenant:
                            continue
                        delay = start + req.arrival_s / scale - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        prompt = [int(x) for x in rng.integers(32, 127, size=req.prompt_tokens)]
                        r = c.post("/v1/requests", json={"model_id": "m", "prompt_tokens": prompt,
                                                         "max_tokens": req.output_tokens})
                        r.raise_for_status()
                        ids[tenant].append(r.json()["request_id"])

            threads = [threading.Thread(target=client, args=(t,), daemon=True) for t in sorted(tenants)]
            meter = CpuMeter(stack_pids(stack, neo4j))
            meter.start()
            for t in threads:
                t.start()
            total = workload.num_requests
            while any(t.is_alive() for t in threads):
                time.sleep(2.0)
                done = admin.get("/v1/stats").json()["counters"]["leases_completed"]
                say(f"{placement}: {time.monotonic() - start:5.0f}s  submitted {sum(map(len, ids.values()))}/{total}"
                    f"  completed {done}")
            deadline = time.monotonic() + drain_timeout_s
            while time.monotonic() < deadline:
                finished = ours(admin.get("/v1/requests", params={"limit": 10_000, "status": "done"}).json())
                if len(finished) >= total:
                    break
                say(f"{placement}: draining, {len(finished)}/{total} done")
                time.sleep(2.0)
            cpu = meter.stop()
            finished = ours(admin.get("/v1/requests", params={"limit": 10_000}).json())
            stats = admin.get("/v1/stats").json()
            try:
                timeline: DeviceTimeline | None = collect_timeline(admin, since_wall)
            except (RuntimeError, httpx.HTTPError) as exc:  # a missing plot must not lose the run
                say(f"{placement}: no device timeline ({exc})")
                timeline = None
    return replace(summarise(placement, finished, stats), cpu_cores=cpu, machine_speed=speed, load_scale=scale,
                   timeline=timeline, devices=timeline.summary() if timeline is not None else {},
                   started_wall=since_wall)


def warm_up(url: str, keys: Mapping[str, str], say: Callable[[str], None], timeout_s: float = 120.0) -> set[str]:
    """One short request per tenant, waited for, before the measured arrivals: each home replica's
    weights are loaded and its code warm, as a running container's are (a guest replica added
    later still pays its own load). Returns their ids, which the summary leaves out."""
    ids: dict[str, str] = {}
    for tenant, key in sorted(keys.items()):
        r = httpx.post(f"{url}/v1/requests", headers={"Authorization": f"Bearer {key}"}, timeout=60.0,
                       json={"model_id": "m", "prompt_tokens": [40, 41, 42, 43], "max_tokens": 4})
        r.raise_for_status()
        ids[tenant] = r.json()["request_id"]
    deadline = time.monotonic() + timeout_s
    waiting = dict(ids)
    while waiting and time.monotonic() < deadline:
        say(f"warming up: {len(ids) - len(waiting)}/{len(ids)} tenants' models ready")
        for tenant, rid in list(waiting.items()):
            row = httpx.get(f"{url}/v1/requests/{rid}", headers={"Authorization": f"Bearer {keys[tenant]}"},
                            timeout=60.0).json()
            if row["status"] not in ("queued", "leased"):
                del waiting[tenant]
        time.sleep(0.1)
    if waiting:
        raise RuntimeError(f"warm-up requests of {', '.join(sorted(waiting))} did not finish in {timeout_s:.0f}s")
    return set(ids.values())


def summarise(placement: str, rows: list[dict[str, Any]], stats: dict[str, Any]) -> LiveRunResult:
    done = [r for r in rows if r["status"] == "done"]
    reqs = [LiveRequest(r["request_id"], r["tenant_id"], r["model_id"], [], r["max_tokens"], r["sla_class"],
                        r["token_budget"], r["arrival"], status=RequestStatus.DONE, output_tokens=r["output_tokens"],
                        ttft_s=r["ttft_s"], e2e_s=r["e2e_s"], finished_at=r["finished_at"]) for r in done]
    first = min((r.arrival for r in reqs), default=0.0)
    last = max((r.finished_at or 0.0 for r in reqs), default=0.0)
    wall = max(1e-9, last - first)
    tokens = sum(len(r.output_tokens) for r in reqs)
    tenants = []
    for tenant in sorted({r.tenant_id for r in reqs}):
        mine = [r for r in reqs if r.tenant_id == tenant]
        ttft = [r.ttft_s or 0.0 for r in mine]
        e2e = [r.e2e_s or 0.0 for r in mine]
        tenants.append(TenantSummary(tenant, len(mine), sum(len(r.output_tokens) for r in mine),
                                     sum(not sla_met(r) for r in mine), _pct(ttft, 0.5), _pct(ttft, 0.99),
                                     _pct(e2e, 0.5), _pct(e2e, 0.99)))
    violations = sum(t.sla_violations for t in tenants)
    guests = sum(1 for d in stats["decisions"] if d.startswith("add "))
    sliced = sum(1 for d in stats["decisions"] if d.startswith("slice "))
    good = sum(len(r.output_tokens) for r in reqs if sla_met(r))
    return LiveRunResult(placement, wall, tokens, tokens / wall, violations / max(1, len(reqs)), tenants,
                         stats["gmg_write_lag_s"], stats["counters"], stats["decisions"], guests,
                         unfinished=len(rows) - len(done), scheduler_steps=stats["scheduler_steps"],
                         scheduler_cpu_s=stats["scheduler_step_s_total"], sliced_guests=sliced,
                         good_tokens_per_s=good / wall)


def compare_placements(workload: Workload, out_dir: Path, *, neo4j: Neo4jSettings | None = None, seed: int = 0,
                       progress: Callable[[str], None] | None = None,
                       calibration: dict[str, Any] | None = None,
                       placements: Sequence[str] = ("container", "replica")) -> dict[str, Any]:
    """The same workload served once per placement (``container`` first, then the others at its
    pace); writes ``live.json``, ``live_latency.png`` and ``live_timeline.png`` (each device's
    leases per placement, :mod:`service.harness.timeline`) into ``out_dir`` and returns the record
    (with ``calibration``, what the load was sized from, when given)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = offered_work(calibration) if calibration is not None else None
    speed = calibration.get("machine", {}).get("speed") if calibration is not None else None
    runs: dict[str, LiveRunResult] = {}
    for p in placements:  # one pace for all, the first run's: the same rates side by side
        pace = next(iter(runs.values())).load_scale if runs else None
        runs[p] = run_live(p, workload, neo4j=neo4j, seed=seed, progress=progress, weights=weights, probe_speed=speed,
                           pace=pace)
    c, s = runs["container"], runs["replica"]
    record = {
        "workload": {"name": workload.name, "requests": workload.num_requests, "duration_s": workload.duration_s,
                     "offered_output_tokens_per_s": sum(r.output_tokens for r in workload.requests)
                     / max(1e-9, workload.duration_s)},
        "runs": {p: r.to_dict() for p, r in runs.items()},
        "tokens_per_s_ratio": s.tokens_per_s / c.tokens_per_s if c.tokens_per_s else float("nan"),
        "sla_violation_rate": {p: r.sla_violation_rate for p, r in runs.items()},
        **({"calibration": calibration} if calibration is not None else {}),
    }
    (out_dir / "live.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    plot_live(out_dir / "live_latency.png", runs)
    timelines = {p: r.timeline for p, r in runs.items() if r.timeline is not None}
    if timelines:
        plot_timelines(out_dir / "live_timeline.png", timelines)
    return record


def offered_work(calibration: dict[str, Any]) -> dict[str, float]:
    """Each tenant's offered work in container devices' worth (its multiple of its measured
    capacity, over the share of the run in which it arrives): what container homes are sized by."""
    duration = calibration["duration_s"]
    return {t: o["multiple_of_capacity"] * max(0.0, 1.0 - o["start_s"] / duration)
            for t, o in calibration["offered"].items()}


def plot_live(path: Path, runs: dict[str, LiveRunResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    tenants = sorted({t.tenant_id for r in runs.values() for t in r.tenants})
    width = 0.8 / len(runs)
    for i, (placement, run) in enumerate(runs.items()):
        by = {t.tenant_id: t for t in run.tenants}
        xs = [j + i * width for j in range(len(tenants))]
        axes[0].bar(xs, [by[t].e2e_p99_s if t in by else 0.0 for t in tenants], width, label=placement)
        axes[1].bar(xs, [by[t].sla_violations / max(1, by[t].requests) if t in by else 0.0 for t in tenants],
                    width, label=placement)
    for ax, title in ((axes[0], "end-to-end p99 (s)"), (axes[1], "SLA violation rate")):
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(tenants))], tenants)
        ax.set_title(title)
        ax.legend()
    fig.suptitle("live service on this CPU: " + ", ".join(f"{p} {r.tokens_per_s:.0f} tok/s" for p, r in runs.items()))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
