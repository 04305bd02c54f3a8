"""What this machine serves, measured before the live comparison, and loads offered relative to it.

The live demo compares placements on whatever machine it runs on. A fixed arrival rate would be
too light on a fast machine and hopeless on a slow or busy one, where both placements fail every
request and the comparison says nothing. So :func:`probe_capacity` first measures each tenant's
model on the devices container placement gives it: a closed loop of requests of the tenant's
mean shape (its mean prompt and output lengths: capacity is of the work the workload brings on
average, not of its median request) at a few concurrencies (a couple of seconds and at least
:data:`ROUNDS` rounds of requests each, after a warm-up request), each request's TTFT and
end-to-end time as the service records them. A level's rate is its concurrency over the mean
end-to-end time (Little's law: what the service sustains with that many requests in it). A
tenant's *capacity* is the highest such rate at which at least :data:`SLA_SHARE` of the probe's
requests met the tenant's SLA.
The probe's homes are the comparison's (tenants weighted by the work their roles offer), and
the busy tenant is probed last, while the others send their offered loads on their own
devices (open Poisson arrivals of their mean shape at their average rates over the run,
:class:`Background`): on a machine of few cores those loads share the cores, the service and
Neo4j with the busy tenant's executor, as they do in the comparison. (Measured on 2 cores:
acme 2.09 req/s beside the others at their active rates, 3.17 beside their average rates,
3.08 alone, and 3.1-4.6 between earlier probes alone: the probe's own spread, levels of a
few seconds, is as large as what the background changes.)
:func:`calibrated_loads` then offers each tenant a multiple of its capacity by its role: the
busy tenant more than its own devices serve (saturated), one steady well below, one idle for
the first part of the run and then bursty. Each offers exactly its rate's count of
requests over its part of the run (``TenantLoad.exact_count``): the bursts are drawn, the amount
is the calibration's, so that a seed does not offer 15% more than the probe measured (a gamma
process of CV 2 over a minute does). Each sized by its own devices' capacity, the loads together
can still fill a machine whose devices share a few cores: :func:`fit_to_machine` projects the
cores they keep busy from the probe's own readings and scales the light tenants' loads down to
:data:`MACHINE_SHARE` of the cores, leaving the idle time a guest uses.

:func:`machine_busy` says when other work already loads the cores (their busy share while the
demo waits, next to the 1-minute load average), in which case no placement comparison on it is
fair; :func:`calibrate` does all three.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import httpx
import numpy as np

from service.graph.connection import Neo4jSettings
from service.harness.live_tenants import register, reset_tenants
from service.harness.stack import LiveStack
from service.sim.sla import SLA_CLASSES
from service.workload.synthetic import TenantLoad

SLA_SHARE = 0.9  # a probe level counts when this share of its requests met the SLA
# Closed-loop concurrencies probed. Not 8, a replica's KV slots: a closed loop that full has every
# request within the SLA (acme 4.9 req/s at 2cd7e1c), yet open arrivals of CV 2 at 1.2x that rate
# queued for 9-19 s (TTFT p50) on the tenant's own executor and left no other tenant room to lend
# (benchmarks/results/live_e2e-probe-c8.json): the saturated role is sized at the batch the
# service runs with slack for its bursts.
LEVELS = (1, 2, 4)
# Each level lasts its seconds and at least this many rounds of its concurrency's requests. At
# 2 s alone, acme's level at concurrency 4 saw 8 requests (two rounds) and read 2.52-3.29 req/s
# across three probes on one quiet machine (3.95 in a fresh clone's demo, whose comparison then
# served acme ~1.6x slower).
ROUNDS = 6
BUSY_LOAD = 0.35  # busy share of the cores (other work) above which the comparison is not fair
QUIET_S = 3.0  # seconds the probe reads the cores busy with the stack idle, and with the others' loads alone


@dataclass(frozen=True)
class ProbeLevel:
    concurrency: int
    requests: int
    requests_per_s: float
    tokens_per_s: float
    ttft_p50_s: float
    tpot_p50_s: float
    sla_met_share: float
    cores_busy: float | None = None  # the machine's cores busy during the level (/proc/stat; None elsewhere)


@dataclass(frozen=True)
class TenantCapacity:
    tenant_id: str
    model: str
    sla_class: str
    levels: list[ProbeLevel]
    requests_per_s: float  # the capacity: highest rate with SLA_SHARE of requests within the SLA
    sla_alone: bool  # False: no level met the SLA; the capacity is then the lowest level's rate
    background_rps: dict[str, float] = field(default_factory=dict)  # the others' loads it was probed beside
    # The machine's cores busy with the stack idle, and with the others' loads alone (before this
    # tenant's levels, beside them): what fit_to_machine splits the projection by. None: not read.
    idle_cores: float | None = None
    background_cores: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: What each demo tenant does, as (role, multiple of its measured capacity). The busy tenant is
#: offered more than its container devices serve; the bursty one is idle for the first
#: :data:`BURSTY_IDLE_SHARE` of the run, then arrives in bursts (gamma gaps, CV 3).
ROLES: dict[str, tuple[str, float]] = {"acme": ("saturated", 1.2), "globex": ("steady", 0.2),
                                       "initech": ("idle then bursty", 0.4)}
BURSTY_IDLE_SHARE = 0.4


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat (None where there is none)."""
    try:
        fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]  # noqa: SIM115 - one line
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share_since(before: tuple[int, int] | None) -> float | None:
    """The share of the machine's core time that was busy since the :func:`cpu_jiffies` reading
    ``before`` (None without one, or when no time passed)."""
    after = cpu_jiffies()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def machine_busy(sample_s: float = 2.0) -> dict[str, Any]:
    """How loaded the machine is while this process waits: the 1-minute load average, the cores,
    and the cores' busy share measured over ``sample_s`` seconds (/proc/stat; the load average
    alone lags and counts the demo's own earlier work). ``busy`` when that share (or, without
    /proc/stat, the load average per core) exceeds :data:`BUSY_LOAD`."""
    cores = os.cpu_count() or 1
    before = cpu_jiffies()
    time.sleep(sample_s if before is not None else 0.0)
    share = busy_share_since(before)
    load = os.getloadavg()[0]
    busy = share > BUSY_LOAD if share is not None else load / cores > BUSY_LOAD
    return {"load_avg_1m": round(load, 2), "cores": cores, "busy_share": None if share is None else round(share, 3),
            "busy": busy}


def _one_request(c: httpx.Client, prompt: list[int], max_tokens: int, timeout_s: float) -> dict[str, Any] | None:
    r = c.post("/v1/requests", json={"model_id": "m", "prompt_tokens": prompt, "max_tokens": max_tokens})
    r.raise_for_status()
    rid = r.json()["request_id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row: dict[str, Any] = c.get(f"/v1/requests/{rid}").json()
        if row["status"] == "done":
            return row
        if row["status"] not in ("queued", "leased"):
            return None
        time.sleep(0.02)
    return None


def _probe_level(url: str, key: str, load: TenantLoad, concurrency: int, level_s: float,
                 rounds: int = 1) -> ProbeLevel:
    """A closed loop of ``concurrency`` clients for ``level_s`` seconds and until the level has
    seen ``rounds`` x ``concurrency`` requests (the requests in flight then finish)."""
    prompt_len = max(1, round(load.prompt_mean_tokens))
    out_len = max(2, round(load.output_mean_tokens))
    sla = SLA_CLASSES[load.sla_class]
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + level_s
    wanted = rounds * concurrency
    sent = [0]

    def client(i: int) -> None:
        prompt = [32 + (i * 7 + k) % 90 for k in range(prompt_len)]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0) as c:
            while True:  # at least one request each (level_s=0: the warm-up's single request)
                with lock:
                    sent[0] += 1
                row = _one_request(c, prompt, out_len, timeout_s=120.0)
                if row is not None:
                    with lock:
                        rows.append(row)
                with lock:
                    done = time.monotonic() >= stop_at and sent[0] >= wanted
                if done:
                    break

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    jiffies = cpu_jiffies()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cores_busy = _cores_busy_since(jiffies)
    ttft = [r["ttft_s"] or 0.0 for r in rows]
    tpot = [((r["e2e_s"] or 0.0) - (r["ttft_s"] or 0.0)) / max(1, len(r["output_tokens"]) - 1) for r in rows]
    met = [sla.slack_s(a, b, r["e2e_s"] or 0.0, prompt_len) >= 0.0 for a, b, r in zip(ttft, tpot, rows, strict=True)]
    # The service's rate at this concurrency by Little's law, from the times it measured: the
    # clients' own polling and the last requests' drain after the level ends are not its work
    # (counting them, a 2 s level read 20-40% low and varied run to run).
    e2e = float(np.mean([r["e2e_s"] or 0.0 for r in rows])) if rows else 0.0
    rate = concurrency / e2e if e2e > 0 else 0.0
    tokens = rate * float(np.mean([len(r["output_tokens"]) for r in rows])) if rows else 0.0
    return ProbeLevel(concurrency, len(rows), rate, tokens,
                      float(np.median(ttft)) if ttft else float("nan"), float(np.median(tpot)) if tpot else float("nan"),
                      sum(met) / len(met) if met else 0.0, cores_busy)


def cores_busy(seconds: float) -> float | None:
    """How many of the machine's cores are busy over the next ``seconds`` (None without /proc/stat)."""
    before = cpu_jiffies()
    time.sleep(seconds if before is not None else 0.0)
    return _cores_busy_since(before)


def _cores_busy_since(before: tuple[int, int] | None) -> float | None:
    """How many of the machine's cores were busy since the :func:`cpu_jiffies` reading ``before``."""
    share = busy_share_since(before)
    return None if share is None else round(share * (os.cpu_count() or 1), 3)


class Background:
    """Open Poisson arrivals of each tenant's mean shape at its rate, posted (not waited for)
    from one thread per tenant while the ``with`` block runs; a failed post is raised on exit."""

    def __init__(self, url: str, keys: dict[str, str], loads: Sequence[TenantLoad], rates: dict[str, float],
                 seed: int = 0) -> None:
        self.url, self.keys, self.seed = url, keys, seed
        self.loads = [load for load in loads if rates.get(load.tenant_id, 0.0) > 0.0]
        self.rates = rates
        self.posted: dict[str, int] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Background:
        for i, load in enumerate(self.loads):
            t = threading.Thread(target=self._send, args=(load, self.seed + i), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        if self.errors and exc[0] is None:
            raise RuntimeError("the capacity probe's background load failed: " + "; ".join(self.errors))

    def _send(self, load: TenantLoad, seed: int) -> None:
        rng = np.random.default_rng(seed)
        prompt = [32 + k % 90 for k in range(max(1, round(load.prompt_mean_tokens)))]
        body = {"model_id": "m", "prompt_tokens": prompt, "max_tokens": max(2, round(load.output_mean_tokens))}
        gap = 1.0 / self.rates[load.tenant_id]
        try:
            with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.keys[load.tenant_id]}"},
                              timeout=60.0) as c:
                at = time.monotonic()
                while True:
                    at += float(rng.exponential(gap))
                    if self._stop.wait(max(0.0, at - time.monotonic())):
                        return
                    c.post("/v1/requests", json=body).raise_for_status()
                    self.posted[load.tenant_id] = self.posted.get(load.tenant_id, 0) + 1
        except Exception as exc:  # reported on exit, not lost with the thread
            self.errors.append(f"{load.tenant_id}: {exc}")


def container_weights(loads: Sequence[TenantLoad], roles: dict[str, tuple[str, float]] = ROLES) -> dict[str, float]:
    """Each tenant's offered work in container devices' worth by its role (its multiple of its
    capacity, over the share of the run in which it arrives): what container homes are sized by."""
    out = {}
    for load in loads:
        role, multiple = roles[load.tenant_id]
        out[load.tenant_id] = multiple * ((1.0 - BURSTY_IDLE_SHARE) if role == "idle then bursty" else 1.0)
    return out


def probe_capacity(loads: Sequence[TenantLoad], *, neo4j: Neo4jSettings | None = None,
                   levels: Sequence[int] = LEVELS, level_s: float = 2.0, rounds: int = ROUNDS,
                   roles: dict[str, tuple[str, float]] = ROLES,
                   progress: Callable[[str], None] | None = None) -> dict[str, TenantCapacity]:
    """Each tenant's capacity on its container devices (see the module docstring), one tenant at a
    time on a live stack like the comparison's: container placement with its homes, two
    executors x two devices; the saturated tenants last, beside the others' offered loads."""
    say = progress or (lambda _: None)
    if neo4j is not None:
        reset_tenants(neo4j, sorted(t.tenant_id for t in loads))
    result: dict[str, TenantCapacity] = {}
    with LiveStack(placement="container", neo4j=neo4j, lease_ttl_s=10.0, heartbeat_s=1.0) as stack:
        work = container_weights(loads, roles)
        keys = register(stack, loads, work)
        stack.start_executor("exec-a", ["cpu:0", "cpu:1"])
        stack.start_executor("exec-b", ["cpu:0", "cpu:1"])
        stack.wait_devices(4)
        for load in sorted(loads, key=lambda t: roles[t.tenant_id][0] == "saturated"):  # stable: others first
            rates = {t: work[t] * c.requests_per_s for t, c in result.items() if roles[t][0] != "saturated"} \
                if roles[load.tenant_id][0] == "saturated" else {}  # their average rates over the run
            beside = f" beside {', '.join(f'{t} {r:.1f}/s' for t, r in rates.items())}" if rates else ""
            idle = background = None
            if rates:  # the stack itself, no load: read here, not at its start, while models are traced
                say(f"capacity probe: the stack idle, before {load.tenant_id}")
                idle = cores_busy(QUIET_S)
            with Background(stack.url, keys, loads, rates):
                say(f"capacity probe: {load.tenant_id} ({load.model}) warming up{beside}")
                _probe_level(stack.url, keys[load.tenant_id], load, 1, 0.0)  # one request: weights loaded, code warm
                if rates:
                    say(f"capacity probe: the others' loads alone{beside}")
                    background = cores_busy(QUIET_S)
                probed = []
                for c in levels:
                    say(f"capacity probe: {load.tenant_id} ({load.model}) at concurrency {c}{beside}")
                    probed.append(_probe_level(stack.url, keys[load.tenant_id], load, c, level_s, rounds))
            good = [p.requests_per_s for p in probed if p.sla_met_share >= SLA_SHARE]
            result[load.tenant_id] = TenantCapacity(load.tenant_id, load.model, load.sla_class, probed,
                                                    max(good) if good else probed[0].requests_per_s, bool(good),
                                                    rates, idle, background)
    if neo4j is not None:
        reset_tenants(neo4j, sorted(t.tenant_id for t in loads))
    return result


# The share of the machine's cores the calibrated loads may keep busy together under container
# placement, as the probe projects it (see fit_to_machine): below CORES_FULL, with room for the
# comparison's bursts, which the probe's background offers at their average rate.
MACHINE_SHARE = 0.8
LIGHT_FLOOR = 0.25  # the light tenants' loads are never cut below this share of their roles' multiples


def _measured_level(capacity: TenantCapacity) -> ProbeLevel:
    """The probe level the tenant's capacity was read at."""
    return min(capacity.levels, key=lambda lv: abs(lv.requests_per_s - capacity.requests_per_s))


def fit_to_machine(capacity: dict[str, TenantCapacity], roles: dict[str, tuple[str, float]] = ROLES,
                   cores: int | None = None, share: float = MACHINE_SHARE) -> dict[str, Any]:
    """How busy the calibrated loads would keep the machine's cores together, and the factor on
    the light (not saturated) tenants' loads that keeps that within ``share`` of the cores.

    Each tenant's capacity is its own devices', but on a machine of few cores every device is a
    share of the same cores. Sized each by its own capacity, the loads together kept 1.75-1.80 of
    2 cores busy under container placement when a probe read every tenant high, and then no idle
    time was left for a guest replica to use (acme within its SLA for 69-74% of its requests,
    against 95-99% at 1.37-1.69 cores).

    The probe reads, for the saturated tenant, the cores busy at the level its capacity was read
    at, beside the others' loads at their average rates: what the comparison offers under
    container placement, so that is the projection (the closed loop's polling of each request
    adds to it, which errs toward idle time). It also reads the cores busy with the stack idle and with
    the others' loads alone; their difference is the light tenants' part. Past the share, the
    light loads are scaled by the factor that brings the projection to it (their part taken as
    proportional to their rate), at least :data:`LIGHT_FLOOR`; the saturated tenant keeps its
    multiple, since it is what the comparison is about. Where a reading is missing (no
    /proc/stat), nothing is projected and the factor is 1."""
    cores = cores or os.cpu_count() or 1
    out: dict[str, Any] = {"cores": cores, "budget_cores": round(share * cores, 3), "projected_cores": None,
                           "light_cores": None, "light_scale": 1.0}
    saturated = [capacity[t] for t in capacity if roles[t][0] == "saturated"]
    if len(saturated) != 1:  # the demo's mix: one saturated tenant, probed beside all the others
        return out
    busy = saturated[0]
    projected = _measured_level(busy).cores_busy
    if projected is None or busy.idle_cores is None or busy.background_cores is None:
        return out
    light = max(0.0, busy.background_cores - busy.idle_cores)
    out.update(projected_cores=round(projected, 3), light_cores=round(light, 3))
    if projected > share * cores and light > 0:
        out["light_scale"] = round(min(1.0, max(LIGHT_FLOOR, (share * cores - (projected - light)) / light)), 3)
    return out


def calibrated_loads(loads: Sequence[TenantLoad], capacity: dict[str, TenantCapacity], duration_s: float,
                     roles: dict[str, tuple[str, float]] = ROLES, light_scale: float = 1.0) -> list[TenantLoad]:
    """``loads`` with each tenant's rate set to its role's multiple of its measured capacity (the
    bursty tenant's rate is its average over the part of the run in which it arrives), the light
    (not saturated) tenants' times ``light_scale`` (:func:`fit_to_machine`)."""
    out = []
    for load in loads:
        role, multiple = roles[load.tenant_id]
        rate = multiple * capacity[load.tenant_id].requests_per_s * (1.0 if role == "saturated" else light_scale)
        if role == "idle then bursty":
            out.append(replace(load, rate_rps=rate, arrival="gamma", burstiness_cv=3.0,
                               start_s=BURSTY_IDLE_SHARE * duration_s, exact_count=True))
        elif role == "steady":
            out.append(replace(load, rate_rps=rate, arrival="gamma", burstiness_cv=0.5, exact_count=True))
        else:
            out.append(replace(load, rate_rps=rate, exact_count=True))
    return out


# The machine's speed this far off the probe's: before a comparison, its runs are paced (load_scale);
# after it, the load offered was not the calibrated one (the demo warns).
SPEED_DRIFT = 0.25
# The share of the machine's cores a comparison kept busy past which little idle time was left for
# a guest to use: on 2 cores, acme met its SLA under replica for 99% of its requests at 1.37 cores
# busy, 95-98% at 1.64-1.69, 74% at 1.75 and 69% at 1.80 (probes that read every tenant high).
CORES_FULL = 0.85


def machine_speed(rounds: int = 9, round_s: float = 0.1) -> float:
    """A fixed CPU workload's rate now: 256x256 float32 matrix products per second with torch on
    one thread (what the executors' models spend their time on), the median of ``rounds`` rounds.
    A shared host's speed drifts: the same model's tokens came 26 ms apart at one probe and 48 ms
    at another, and a probe on a fast spell sizes a load the comparison after it cannot serve."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core's speed: threads that spin-wait on a busy core read far slower
    try:
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        started = time.perf_counter()
        while time.perf_counter() - started < 2 * round_s:  # warm up: a process's first products run slower
            torch.mm(a, b)
        rates = []
        for _ in range(rounds):
            n, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < round_s:
                torch.mm(a, b)
                n += 1
            rates.append(n / elapsed)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(rates)


def speed_drift(before: float | None, after: float | None) -> float | None:
    """How much faster (positive) or slower the machine ran after than before, as a share of
    before; ``None`` when either reading is missing."""
    if not before or after is None:
        return None
    return after / before - 1.0


def load_scale(probe_speed: float | None, run_speed: float | None) -> float:
    """The factor on the calibrated load for a run whose machine ran at ``run_speed`` where the
    probe's ran at ``probe_speed``: 1.0 while the drift is within :data:`SPEED_DRIFT` (an idle
    machine's readings spread about 15%, so a smaller drift is the measure's noise, not the
    machine's), else their ratio, so that the load offered stays the same multiple of what the
    machine serves at the time of the run."""
    drift = speed_drift(probe_speed, run_speed)
    if drift is None or not run_speed or abs(drift) <= SPEED_DRIFT:
        return 1.0
    return 1.0 + drift


def calibrate(loads: Sequence[TenantLoad], duration_s: float, *, neo4j: Neo4jSettings | None = None,
              level_s: float = 2.0, progress: Callable[[str], None] | None = None
              ) -> tuple[list[TenantLoad], dict[str, Any]]:
    """Probe, then size: the loads to offer and the record of what they came from (the machine's
    load before the probe and its speed at it, each tenant's capacity, each tenant's offered rate)."""
    before = machine_busy()
    first = machine_speed()
    capacity = probe_capacity(loads, neo4j=neo4j, level_s=level_s, progress=progress)
    # The speed the loads were sized at: the mean of a reading before and one after the probe (a
    # single reading is the reference of every later pace, and one read 20% below the rest, 2319
    # against 2779-2944, paced a comparison that needed none)
    readings = [round(first, 1), round(machine_speed(), 1)]
    before["speed"], before["speed_readings"] = round(statistics.mean(readings), 1), readings
    fit = fit_to_machine(capacity)
    offered = calibrated_loads(loads, capacity, duration_s, light_scale=fit["light_scale"])
    record = {
        "machine": before,
        "duration_s": duration_s,
        "capacity": {t: c.to_dict() for t, c in capacity.items()},
        "machine_fit": fit,
        # multiple_of_capacity is the role's (container homes are sized by it, in the probe as in the
        # comparison); the rate is that multiple of the capacity times scaled_by (fit_to_machine)
        "offered": {o.tenant_id: {"role": ROLES[o.tenant_id][0], "multiple_of_capacity": ROLES[o.tenant_id][1],
                                  "scaled_by": 1.0 if ROLES[o.tenant_id][0] == "saturated" else fit["light_scale"],
                                  "rate_rps": o.rate_rps, "start_s": o.start_s,
                                  "output_tokens_per_s": o.rate_rps * o.output_median_tokens
                                  * (1.0 - o.start_s / duration_s)}
                    for o in offered},
    }
    return offered, record
