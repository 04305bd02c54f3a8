"""chaos: is every accepted request done exactly once while executors, serve and Neo4j are killed and restarted?

Real processes on loopback: the managed Neo4j in a private state dir, ``slicesched serve`` in
managed mode (``SLICESCHED_STATE`` set, no ``SLICESCHED_NEO4J_URI``: it finds the server in
``<state>/neo4j/server.json``, as a user's service does) and two executor daemons (one CPU
device each, one torch thread). Two tenants with a ``tiny`` model each (container placement
gives each executor one) get a steady Poisson load. Every logical request carries an
``Idempotency-Key`` (a uuid) and a prompt whose first three tokens encode its index; an attempt
that times out (``--client-timeout-s``), gets a 5xx/408/429 or no connection is retried with the
same key and body until ``--give-up-s`` after its first attempt. Meanwhile a seeded schedule
of faults runs one at a time: kill -9 of an executor (restarted after a pause), kill -9 of
serve (restarted on the same port against the same Neo4j), a clean Neo4j stop/start (on a new
port when asked, on the old one otherwise; this and the serve kill come right after a burst of
``--burst`` longer requests, so that they strike work in flight) and, first, bad
registrations: executors whose one device has ``mem_bytes: 1``, two by default, 5 s apart, so
that the second is still registered when the first is dropped as silent (with one alone, the
re-plan after its drop has nothing unplaceable left). A supervisor restarts any executor (or serve) that exits on its own, with
backoff, as systemd would, and records why it exited (``harness_events``).

With ``--placement slice`` (record ``chaos-slice.json``) the scheduler may cut a backlogged tenant's
model into slices on the other tenant's device; ``--busy-share`` sends most arrivals to the first
tenant and ``--busy-family`` gives it a heavier model, so that its home falls behind and the kills
strike executors holding a sliced guest's leases (counted in
``results.executor_kills_holding_sliced_guests``, from ``/v1/stats`` just before each kill). Under
``slice`` an executor kill waits up to ``--holder-wait-s`` (10 s) for an executor to hold a sliced
guest's leases and strikes it (``retargeted_from`` and ``waited_for_holder_s`` in the fault's log),
the planned target when none does. ``--placement slice`` alone brings the record's settings
(``--rate 3 --busy-share 0.9 --busy-family small-llama``); options given win.

After the schedule and a cool-down the load stops, the service gets ``--drain-s`` to finish
every accepted request, then the record compares what the client was told, what the API says
and what the GMG holds (admin ``POST /v1/inspect``; straight to Neo4j when the API cannot answer):

* ``submitted``: logical requests attempted; ``accepted``: at least one attempt got a 202.
* ``done_once``: accepted, one request in the service, ``done`` in the API and in the GMG with
  exactly one done Slice, and at most one completion accepted by the service (executor logs).
* ``duplicated``: more than one request in the service for one logical request (Request nodes
  found by the prompt's index, 202 answers with different ids), or a request with more than one
  done Slice, or more than one accepted completion (it ran to the end twice).
* ``stuck``: accepted and still ``queued``/``leased`` after the drain deadline.
* ``lost``: accepted, not done and not queued/leased: unknown to the service, ``failed`` or
  ``cancelled`` (``lost_by_reason``).
* ``done_not_durable``: the API says ``done`` but the GMG does not (no done Slice or another
  status): a restart would run it again. ``accepted`` is the sum of the five.
* ``reconciliation_violations``: rows of the named query ``reconciliation_violations`` with
  ``since`` the start of the load and ``stale_before`` the launch of the last serve process.
* ``faults``: faults injected per kind; with each fault the time to the next 202 of an attempt
  sent after it and to the next completion, plus submission outcomes (503s, timeouts),
  ``/healthz`` over time and the executors' unplanned exits.
* ``recovery_s_max``: the longest the service took to answer a 202 again once a fault was over
  (the killed process, or Neo4j, answering again), per fault in ``recovery_s`` (with the times
  from the strike). Target (issue 41): <= 30 s.

Every wait is bounded, and every process started (serve, executors, Neo4j) is stopped on exit,
Ctrl-C included. Writes ``benchmarks/results/chaos.json``; the processes' logs stay in
``--log-dir``. Target (issue 9): 0 lost, 0 duplicated, 0 stuck, 0 violations.
"""

from __future__ import annotations

import collections
import json
import queue
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record

TERMINAL = {"done", "failed", "cancelled"}
OPEN = {"queued", "leased"}
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
HEAD_TOKENS = 3  # the prompt's first tokens encode the logical request's index (base 95 from 32)
EXECUTORS = ("exec-a", "exec-b")


# ---- keys ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Keys:
    """The keys the stack runs with. Executors get their own key (not the admin's), passed as
    ``SLICESCHED_EXECUTOR_KEY`` to serve and ``--key`` to the daemons; where executor keys
    become per-pool objects created through the API, :func:`executor_key` is the one place to change."""

    admin: str
    executor: str


def make_keys(seed: int) -> Keys:
    return Keys(admin=f"admin-chaos-{seed}-{uuid.uuid4().hex[:12]}",
                executor=f"exec-chaos-{seed}-{uuid.uuid4().hex[:12]}")


def executor_key(keys: Keys) -> str:
    """The key executors (and the bad registration) present."""
    return keys.executor


# ---- the client's view ---------------------------------------------------------------------------
def encode_index(i: int) -> list[int]:
    return [32 + (i // 95**2) % 95, 32 + (i // 95) % 95, 32 + i % 95]


def decode_index(head: list[int]) -> int | None:
    if len(head) < HEAD_TOKENS or any(not 32 <= t < 127 for t in head[:HEAD_TOKENS]):
        return None
    a, b, c = (t - 32 for t in head[:HEAD_TOKENS])
    return a * 95**2 + b * 95 + c


@dataclass
class Attempt:
    sent_s: float  # seconds since the load started
    done_s: float
    outcome: str  # accepted | http_<code> | timeout | connect | transport
    request_id: str | None = None


@dataclass
class Logical:
    index: int
    tenant: str
    key: str  # Idempotency-Key
    prompt: list[int]
    max_tokens: int
    arrival_s: float
    burst: bool = False  # sent just before a fault, so that the fault finds work in flight
    attempts: list[Attempt] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)  # distinct ids answered with 202
    rejected: str | None = None  # a 4xx that is not retried
    gave_up: bool = False

    @property
    def accepted(self) -> bool:
        return bool(self.request_ids)


class Load:
    """Poisson arrivals, each a logical request retried with the same key until it is answered."""

    def __init__(self, url: str, tenant_keys: dict[str, str], rng: Any, *, rate_per_s: float, prompt_len: int,
                 max_tokens: int, timeout_s: float, give_up_s: float, workers: int, clock: Any,
                 follow: Any = None, first_share: float | None = None) -> None:
        import httpx

        self.first_share = first_share  # the first tenant's share of the arrivals; None: every tenant alike
        self.follow = follow  # leader election: () -> the leader's address, asked after a refused call
        self.rng = rng
        self.rate_per_s = rate_per_s
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.give_up_s = give_up_s
        self.clock = clock
        self.tenants = sorted(tenant_keys)
        limits = httpx.Limits(max_connections=workers + 4, max_keepalive_connections=workers)
        self.clients = {t: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {k}"},
                                        timeout=httpx.Timeout(timeout_s), limits=limits)
                        for t, k in tenant_keys.items()}
        self.logical: list[Logical] = []
        self.lock = threading.Lock()
        self._queue: queue.Queue[Logical | None] = queue.Queue()
        self._stop_arrivals = threading.Event()
        self._stop_all = threading.Event()  # abandon retries at once (Ctrl-C, or the end of the drain)
        self._threads = [threading.Thread(target=self._arrivals, name="arrivals", daemon=True)]
        self._threads += [threading.Thread(target=self._worker, name=f"client-{i}", daemon=True)
                          for i in range(workers)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop_arrivals(self) -> None:
        self._stop_arrivals.set()

    def finish(self, timeout_s: float) -> bool:
        """Wait for the logical requests in flight (each bounded by give_up_s); True if all ended."""
        self._stop_arrivals.set()
        for _ in self._threads[1:]:
            self._queue.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        ended = not any(t.is_alive() for t in self._threads)
        self.abandon()
        return ended

    def abandon(self) -> None:
        self._stop_all.set()
        self._stop_arrivals.set()

    def close(self) -> None:
        self.abandon()
        for c in self.clients.values():
            c.close()

    def _new(self, max_tokens: int, *, burst: bool = False) -> Logical:
        """A new logical request, queued for a client thread (call with the lock held)."""
        i = len(self.logical)
        tail = [int(x) for x in self.rng.integers(32, 127, size=max(0, self.prompt_len - HEAD_TOKENS))]
        if self.first_share is None:
            tenant = self.tenants[int(self.rng.integers(len(self.tenants)))]
        else:
            rest = (1.0 - self.first_share) / max(1, len(self.tenants) - 1)
            tenant = self.tenants[int(self.rng.choice(len(self.tenants),
                                                      p=[self.first_share] + [rest] * (len(self.tenants) - 1)))]
        req = Logical(i, tenant,
                      str(uuid.UUID(bytes=self.rng.bytes(16), version=4)), encode_index(i) + tail, max_tokens,
                      self.clock(), burst=burst)
        self.logical.append(req)
        self._queue.put(req)
        return req

    def burst(self, n: int, max_tokens: int) -> list[Logical]:
        with self.lock:
            return [self._new(max_tokens, burst=True) for _ in range(n)]

    def _arrivals(self) -> None:
        next_s = self.clock()
        while not self._stop_arrivals.is_set():
            with self.lock:
                next_s += float(self.rng.exponential(1.0 / self.rate_per_s))
            if self._stop_arrivals.wait(max(0.0, next_s - self.clock())):
                return
            with self.lock:
                self._new(self.max_tokens)

    def _worker(self) -> None:
        while not self._stop_all.is_set():
            req = self._queue.get()
            if req is None:
                return
            self._submit(req)

    def _submit(self, req: Logical) -> None:
        import httpx

        client = self.clients[req.tenant]
        body = {"model_id": "m", "prompt_tokens": req.prompt, "max_tokens": req.max_tokens}
        first_s = self.clock()
        backoff_s = 0.25
        while not self._stop_all.is_set():
            sent = self.clock()
            request_id, retry_after_s = None, 0.0
            try:
                r = client.post("/v1/requests", json=body, headers={"Idempotency-Key": req.key})
                if r.status_code == 202:
                    outcome, request_id = "accepted", str(r.json()["request_id"])
                else:
                    outcome = f"http_{r.status_code}"
                    retry_after_s = _seconds(r.headers.get("retry-after"))
            except httpx.TimeoutException:
                outcome = "timeout"
            except httpx.ConnectError:
                outcome = "connect"
            except (httpx.TransportError, ValueError, KeyError):
                outcome = "transport"
            with self.lock:
                req.attempts.append(Attempt(sent, self.clock(), outcome, request_id))
                if request_id is not None and request_id not in req.request_ids:
                    req.request_ids.append(request_id)
            if request_id is not None:
                return
            if self.follow is not None and outcome in ("connect", "http_503"):  # a Service address would do this
                client.base_url = httpx.URL(self.follow())
            if outcome.startswith("http_") and int(outcome[5:]) not in RETRY_STATUS:
                req.rejected = f"{outcome}: {r.text[:200]}"
                return
            pause_s = max(backoff_s, min(5.0, retry_after_s))  # a Retry-After is honoured, up to 5 s
            if self.clock() - first_s + pause_s > self.give_up_s:
                req.gave_up = True
                return
            if self._stop_all.wait(pause_s):
                return
            backoff_s = min(2.0, backoff_s * 2)

    def snapshot(self) -> list[Logical]:
        with self.lock:
            return list(self.logical)


def _seconds(header: str | None) -> float:
    try:
        return max(0.0, float(header)) if header else 0.0
    except ValueError:  # an HTTP date: not worth parsing here
        return 0.0


class HealthProbe:
    """``GET /healthz`` once a second: the status (or the error) and the latency over time."""

    def __init__(self, stack: Any, clock: Any, *, period_s: float = 1.0, timeout_s: float = 2.0) -> None:
        self.stack, self.clock, self.period_s, self.timeout_s = stack, clock, period_s, timeout_s
        self.samples: list[tuple[float, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthz", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 1)

    def _run(self) -> None:
        import httpx

        while not self._stop.wait(self.period_s):
            t = self.clock()
            try:
                r = httpx.get(f"{self.stack.url}/healthz", timeout=self.timeout_s)
                status = f"{r.status_code}" + ("" if r.status_code != 200 else f" {r.json().get('status', '?')}")
            except httpx.TimeoutException:
                status = "timeout"
            except httpx.ConnectError:
                status = "connect"
            except (httpx.HTTPError, ValueError):
                status = "error"
            self.samples.append((t, status, self.clock() - t))

    def last(self) -> str:
        return self.samples[-1][1] if self.samples else "-"

    def summary(self) -> dict[str, Any]:
        counts = collections.Counter(s for _, s, _ in self.samples)
        segments: list[list[Any]] = []  # [from_s, to_s, status]: runs of one answer
        for t, s, _ in self.samples:
            if segments and segments[-1][2] == s:
                segments[-1][1] = round(t, 1)
            else:
                segments.append([round(t, 1), round(t, 1), s])
        lat = sorted(d for _, s, d in self.samples if s.startswith("200"))
        return {"samples": len(self.samples), "by_status": dict(counts), "segments": segments,
                "latency_ms_p50": round(1000 * lat[len(lat) // 2], 1) if lat else None,
                "latency_ms_p99": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None}


# ---- processes ----------------------------------------------------------------------------------------
class Cluster:
    """The stack's processes under one lock: faults and the supervisor never act at once."""

    def __init__(self, stack: Any, clock: Any, *, serve_timeout_s: float) -> None:
        self.stack = stack
        self.clock = clock
        self.serve_timeout_s = serve_timeout_s
        self.lock = threading.RLock()
        self.events: list[dict[str, Any]] = []  # unplanned exits, restarts that failed, harness fixes
        self._backoff_s: dict[str, float] = {}
        self._next_try_s: dict[str, float] = {}
        self._started_s: dict[str, float] = {}
        self.restarts_left = 400
        self.closing = False  # set before the processes are stopped: nothing starts any more
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="supervisor", daemon=True)

    def note(self, kind: str, **detail: Any) -> None:
        self.events.append({"t_s": round(self.clock(), 2), "kind": kind, **detail})

    def mark_log(self, name: str, text: str) -> None:
        with open(self.stack.log_dir / name, "a") as f:
            f.write(f"=== chaos {time.strftime('%H:%M:%S')} (t={self.clock():.1f}s): {text} ===\n")

    # executors
    def start_executor(self, name: str) -> None:
        if self.closing:
            raise RuntimeError("closing: no process starts any more")
        self.mark_log(f"executor-{name}.log", f"start {name}")
        self.stack.start_executor(name, ["cpu:0"], mem_gib=2.0, extra=["--threads", "1"])
        self._started_s[name] = self.clock()

    def kill_executor(self, name: str) -> None:
        self.mark_log(f"executor-{name}.log", f"kill -9 {name}")
        self.stack.stop_executor(name, kill=True)

    # serve
    def start_server(self) -> None:
        """Start serve; if it cannot (e.g. another process took its port), try once more on a new
        port and restart the executors against it (a harness fix, recorded)."""
        if self.closing:
            raise RuntimeError("closing: no process starts any more")
        self.mark_log("serve.log", "start serve")
        try:
            self.stack.start_server(timeout_s=self.serve_timeout_s)
            return
        except RuntimeError as exc:
            self.note("serve_start_failed", port=self.stack.port, error=str(exc),
                      log_tail=tail(self.stack.log_dir / "serve.log"))
        self.stack.stop_server(kill=True)
        self.stack.port = 0
        self.mark_log("serve.log", "start serve on a new port")
        self.stack.start_server(timeout_s=self.serve_timeout_s)
        self.note("serve_moved_port", port=self.stack.port)
        for name in list(self.stack.executors):
            self.kill_executor(name)
            self.start_executor(name)

    def kill_server(self) -> None:
        self.mark_log("serve.log", f"kill -9 serve on port {self.stack.port}")
        self.stack.stop_server(kill=True)

    def kill_standby(self) -> None:
        self.mark_log("serve-standby.log", f"kill -9 the standby on port {self.stack.standby_port}")
        if self.stack.standby is not None:
            self.stack.standby.kill()
            self.stack.standby.wait()
            self.stack.standby = None

    def start_standby(self) -> None:
        if self.closing:
            raise RuntimeError("closing: no process starts any more")
        self.mark_log("serve-standby.log", f"start the standby on port {self.stack.standby_port}")
        self.stack.start_standby(timeout_s=self.serve_timeout_s)

    def restart_exited(self) -> None:
        """What the supervisor does between faults, for a fault that waits on a serve process that
        may have exited meanwhile (the supervisor does not run while a fault holds the lock)."""
        server = self.stack.server
        if server is not None and server.poll() is not None:
            try:
                self._check()
            except Exception as exc:  # as in the supervisor: retried at the next call
                self.note("supervisor_error", error=f"{type(exc).__name__}: {exc}")

    # the supervisor
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop supervising; a restart under way may outlive ``timeout_s`` (see :meth:`running`)."""
        self.closing = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def running(self) -> bool:
        return self._thread.is_alive()

    def _supervise(self) -> None:
        while not self._stop.wait(1.0) and not self.closing:
            if not self.lock.acquire(timeout=0.5):
                continue  # a fault is acting
            try:
                self._check()
            except Exception as exc:  # a failed restart is retried next time, never fatal
                self.note("supervisor_error", error=f"{type(exc).__name__}: {exc}")
            finally:
                self.lock.release()

    def _check(self) -> None:
        now = self.clock()
        if self.stack.leader_ttl_s is not None:  # leader election: keep stack.url the leader's; the standby up
            if self.stack.follow_leader():
                self.note("leader_moved", port=self.stack.port)
            standby = self.stack.standby
            if standby is not None and standby.poll() is not None:
                self.note("standby_exited", returncode=standby.returncode,
                          log_tail=tail(self.stack.log_dir / "serve-standby.log"))
                self.stack.standby = None
            if self.stack.standby is None and self.stack.standby_port and self.restarts_left > 0:
                self.restarts_left -= 1
                try:
                    self.start_standby()
                    self.note("standby_restarted_by_supervisor")
                except RuntimeError as exc:
                    self.note("standby_restart_failed", error=str(exc))
        server = self.stack.server
        if server is not None and server.poll() is not None:
            self.note("serve_exited", returncode=server.returncode, log_tail=tail(self.stack.log_dir / "serve.log"))
            self.stack.server = None
        if self.stack.server is None and self.restarts_left > 0 and now >= self._next_try_s.get("serve", 0.0):
            self.restarts_left -= 1
            try:
                self.start_server()
                self.note("serve_restarted_by_supervisor")
            except RuntimeError as exc:
                self._next_try_s["serve"] = now + 5.0
                self.note("serve_restart_failed", error=str(exc))
        for name in EXECUTORS:
            proc = self.stack.executors.get(name)
            if proc is not None and proc.poll() is None:
                if now - self._started_s.get(name, now) > 30.0:
                    self._backoff_s.pop(name, None)  # it stayed up: the next exit restarts at once
                continue
            if proc is not None:  # it exited on its own
                del self.stack.executors[name]
                delay = self._backoff_s.get(name, 1.0)
                self._backoff_s[name] = min(16.0, delay * 2)
                self._next_try_s[name] = now + delay
                self.note("executor_exited", executor=name, returncode=proc.returncode,
                          log_tail=tail(self.stack.log_dir / f"executor-{name}.log"), restart_in_s=delay)
            if now >= self._next_try_s.get(name, 0.0) and self.restarts_left > 0:
                self.restarts_left -= 1
                self.start_executor(name)


def kill_all(stack: Any) -> None:
    for name in list(stack.executors):
        stack.stop_executor(name, kill=True)
    stack.stop_server(kill=True)


def tail(path: Path, lines: int = 3) -> list[str]:
    try:
        text = path.read_bytes()[-4000:].decode(errors="replace")
    except OSError:
        return []
    return [ln[:300] for ln in text.splitlines()[-lines:]]


# ---- faults -----------------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str  # executor_kill | serve_kill | leader_kill | neo4j_restart | bad_registration
    planned_s: float
    target: str = ""  # the executor; for neo4j_restart "new_port" or "same_port"
    started_s: float | None = None
    ended_s: float | None = None
    started_epoch: float | None = None
    ok: bool = False
    detail: dict[str, Any] = field(default_factory=dict)


def plan_faults(rng: Any, counts: dict[str, int], port_changes: int, start_s: float, end_s: float,
                bad_gap_s: float) -> list[Fault]:
    """The bad registrations first, ``bad_gap_s`` apart (every later fault runs on a service that
    has absorbed them; two within the silence timeout are both registered when the first is
    dropped), then the rest in a seeded order, one per slot at a seeded offset in its first half."""
    rest: list[Fault] = []
    for i in range(counts["executor_kill"]):
        rest.append(Fault("executor_kill", 0.0, EXECUTORS[int(rng.integers(len(EXECUTORS)))] if i else EXECUTORS[0]))
    rest += [Fault("serve_kill", 0.0) for _ in range(counts["serve_kill"])]
    rest += [Fault("leader_kill", 0.0) for _ in range(counts.get("leader_kill", 0))]
    rest += [Fault("neo4j_restart", 0.0, "new_port" if i < port_changes else "same_port")
             for i in range(counts["neo4j_restart"])]
    bad = [Fault("bad_registration", round(start_s + i * bad_gap_s, 2)) for i in range(counts["bad_registration"])]
    order = [rest[int(i)] for i in rng.permutation(len(rest))]
    first_s = start_s + len(bad) * bad_gap_s
    slot = (end_s - first_s) / max(1, len(order))
    for i, f in enumerate(order):
        f.planned_s = round(first_s + i * slot + float(rng.uniform(0, slot / 2)), 2)
    return bad + order


def send_burst(load: Load, n: int, max_tokens: int, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """``n`` long requests right before a fault; returns once they are accepted (or after ``timeout_s``)
    and have had a moment to be leased."""
    reqs = load.burst(n, max_tokens)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(r.accepted or r.gave_up or r.rejected for r in reqs):
        time.sleep(0.05)
    time.sleep(0.3)
    return {"burst": n, "burst_accepted": sum(r.accepted for r in reqs)}


def sliced_guests_held(stack: Any) -> dict[str, int] | None:
    """Per executor, the sliced guests (placement slice) holding leases with a slice on it, from
    ``/v1/stats`` just before a kill (None: the service did not answer within 2 s)."""
    try:
        with stack.client(timeout_s=2.0) as c:
            replicas = c.get("/v1/stats").json()["replicas"]
    except Exception:
        return None
    return {e: sum(1 for r in replicas if r.get("slices") and r["leases"] > 0
                   and any(s["device"].startswith(f"{e}/") for s in r["slices"])) for e in EXECUTORS}


# Under --placement slice, unless told otherwise: a busy first tenant on a heavier model whose home
# falls behind, so that the scheduler places sliced guests and executor kills can strike them (the
# record chaos-slice.json is made with these; with both tenants alike on tiny models nothing is sliced).
SLICE_DEFAULTS: dict[str, Any] = {"rate": 3.0, "busy_share": 0.9, "busy_family": "small-llama", "holder_wait_s": 10.0}
PLAIN_DEFAULTS: dict[str, Any] = {"rate": 2.0, "busy_share": None, "busy_family": "tiny", "holder_wait_s": 0.0}


def apply_placement_defaults(args: Any) -> None:
    """Fill the options left unset with the defaults of ``args.placement`` (given options win)."""
    defaults = SLICE_DEFAULTS if args.placement == "slice" else PLAIN_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def wait_for_holder(stack: Any, wait_s: float, *, period_s: float = 0.5) -> tuple[dict[str, int] | None, float]:
    """Sliced guests held per executor, polled until one holds or ``wait_s`` passes; with the
    seconds waited (an executor kill under ``slice`` strikes a holder when there is one)."""
    t0 = time.monotonic()
    while True:
        held = sliced_guests_held(stack)
        waited = time.monotonic() - t0
        if any(n > 0 for n in (held or {}).values()) or waited >= wait_s:
            return held, round(waited, 2)
        time.sleep(min(period_s, max(0.0, wait_s - waited)))


def inject(f: Fault, cluster: Cluster, keys: Keys, rng: Any, load: Load, *, neo4j_down_s: float,
           burst: int, burst_max_tokens: int, prefer_sliced: bool = False, holder_wait_s: float = 0.0) -> None:
    """Run one fault; ``f.started_s`` becomes the moment it strikes (after its burst). With
    ``prefer_sliced`` an executor kill strikes an executor holding a sliced guest's leases when
    one does within ``holder_wait_s`` (``retargeted_from``: the planned target; ``waited_for_holder_s``),
    else the planned one."""
    import httpx

    from service.graph.local_server import free_port

    stack = cluster.stack
    if burst and f.kind in ("serve_kill", "leader_kill", "neo4j_restart"):
        f.detail.update(send_burst(load, burst, burst_max_tokens), burst_sent_s=f.started_s)
        f.started_s, f.started_epoch = round(cluster.clock(), 2), time.time()
    if f.kind == "executor_kill":
        if prefer_sliced:
            held, waited = wait_for_holder(stack, holder_wait_s)
            f.detail.update(waited_for_holder_s=waited)
            f.started_s, f.started_epoch = round(cluster.clock(), 2), time.time()
        else:
            held = sliced_guests_held(stack)
        holders = sorted(e for e, n in (held or {}).items() if n > 0)
        if prefer_sliced and holders and f.target not in holders:
            f.detail.update(retargeted_from=f.target)
            f.target = holders[0]
        f.detail.update(sliced_guests_held=None if held is None else held[f.target])
        cluster.kill_executor(f.target)
        pause = round(float(rng.uniform(0.5, 3.0)), 2)
        time.sleep(pause)
        cluster.start_executor(f.target)
        f.detail.update(restart_after_s=pause)
    elif f.kind == "serve_kill" and stack.leader_ttl_s is not None:  # under election: the standby
        cluster.kill_standby()
        time.sleep(1.0)
        t = time.monotonic()
        cluster.start_standby()
        f.detail.update(restart_s=round(time.monotonic() - t, 2), port=stack.standby_port, target="standby")
    elif f.kind == "serve_kill":
        cluster.kill_server()
        time.sleep(1.0)
        t = time.monotonic()
        cluster.start_server()
        f.detail.update(restart_s=round(time.monotonic() - t, 2), port=stack.port)
    elif f.kind == "leader_kill":
        stack.follow_leader()
        port = stack.port
        cluster.kill_server()
        killed = time.monotonic()
        stack.promote_standby()
        took_s = None
        while time.monotonic() - killed < 60.0:  # the standby takes over once the term ends
            # the standby may have exited meanwhile (a leader deposed after a Neo4j restart ends
            # its process): started again now, as a Deployment does, not once this fault is over
            cluster.restart_exited()
            try:
                if httpx.get(f"{stack.url}/readyz", timeout=1.0).status_code == 200:
                    took_s = round(time.monotonic() - killed, 2)
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        f.detail.update(takeover_s=took_s, killed_port=port, leader_port=stack.port, back_s=round(cluster.clock(), 2))
        stack.standby_port = port  # the killed process comes back as the standby, as a Deployment restarts it
        t = time.monotonic()
        cluster.start_standby()
        f.detail.update(standby_restart_s=round(time.monotonic() - t, 2))
    elif f.kind == "neo4j_restart":
        old = stack.local_neo4j.status()
        old_port = old.port if old is not None else None
        t = time.monotonic()
        stack.stop_neo4j()
        stop_s = time.monotonic() - t
        time.sleep(neo4j_down_s)
        port = old_port if f.target == "same_port" else None
        while port is None or (f.target == "new_port" and port == old_port):
            port = free_port()
        t = time.monotonic()
        try:
            stack.start_neo4j(port=port)
        except Exception as exc:  # e.g. the old port was taken meanwhile: a new one, recorded
            cluster.note("neo4j_start_failed", port=port, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            port = free_port()
            stack.start_neo4j(port=port)
        f.detail.update(old_port=old_port, new_port=port, stop_s=round(stop_s, 2),
                        start_s=round(time.monotonic() - t, 2), down_s=neo4j_down_s)
    elif f.kind == "bad_registration":
        name = f"chaos-bad-{int(rng.integers(1_000_000))}"
        body = {"executor_id": name, "host_id": name,
                "devices": [{"device_id": "cpu:0", "kind": "cpu", "mem_bytes": 1}]}
        try:
            r = httpx.post(f"{stack.url}/v1/executors", json=body, timeout=10.0,
                           headers={"Authorization": f"Bearer {executor_key(keys)}"})
            f.detail.update(executor_id=name, status=r.status_code, answer=r.text[:300])
        except httpx.HTTPError as exc:
            f.detail.update(executor_id=name, error=f"{type(exc).__name__}: {exc}")
    else:
        raise ValueError(f"unknown fault {f.kind!r}")


# ---- what the service and the GMG say at the end ---------------------------------------------------------------
class Inspector:
    """Admin reads: the API first; Cypher straight to the stack's Neo4j when the API cannot answer."""

    def __init__(self, stack: Any, admin_key: str) -> None:
        self.stack = stack
        self.admin_key = admin_key
        self.sources: dict[str, str] = {}
        self._inspect_error: str | None = None  # once the API could not inspect, the rest goes direct

    def _api(self, method: str, path: str, *, tries: int = 3, timeout_s: float = 10.0, **kw: Any) -> Any:
        import httpx

        last = None
        for _ in range(tries):
            try:
                r = httpx.request(method, f"{self.stack.url}{path}", timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {self.admin_key}"}, **kw)
                if r.status_code < 500:
                    return r
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(1.0)
        raise RuntimeError(last)

    def cypher(self, what: str, *, query: str | None = None, name: str | None = None,
               params: dict[str, Any]) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"params": params, **({"query": query} if query else {"name": name})}
        if self._inspect_error is None:
            try:
                r = self._api("POST", "/v1/inspect", tries=1, timeout_s=15.0, json=body)
                if r.status_code == 200:
                    table = r.json()
                    self.sources[what] = "api"
                    return [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]
                self._inspect_error = f"{r.status_code} {r.text[:300]}"
            except RuntimeError as exc:
                self._inspect_error = str(exc)
        self.sources[what] = f"neo4j direct (api: {self._inspect_error})"
        text = query or (_record.ROOT / "cypher" / "inspect" / f"{name}.cypher").read_text()
        return self._direct(text, params)

    def _direct(self, text: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        from neo4j import GraphDatabase

        info = self.stack.local_neo4j.status()
        if info is None:
            raise RuntimeError("the stack's Neo4j is not running")
        with GraphDatabase.driver(info.uri, auth=None, notifications_min_severity="OFF") as driver:
            records, _, _ = driver.execute_query(text, params, routing_="r")
            return [r.data() for r in records]

    def requests(self, ids: list[str]) -> tuple[dict[str, dict[str, Any]], str]:
        """The API's record of each id (absent: unknown to the service), and a note on how it was read."""
        out: dict[str, dict[str, Any]] = {}
        try:
            r = self._api("GET", "/v1/requests", params={"limit": 10_000})
            r.raise_for_status()
            out = {row["request_id"]: row for row in r.json()}
        except Exception as exc:
            return {}, f"unavailable: {exc}"
        missing = [i for i in ids if i not in out][:2000]
        unknown = 0
        for rid in missing:  # more than 10,000 requests, or unknown to this process
            try:
                r = self._api("GET", f"/v1/requests/{rid}")
            except RuntimeError:
                continue
            if r.status_code == 200:
                out[rid] = r.json()
            else:
                unknown += 1
        return out, f"api ({len(out)} requests; {unknown} of ours unknown)"


def accepted_completions(log_dir: Path) -> collections.Counter[str]:
    """Completions each request had accepted by the service, from the executors' logs."""
    done = re.compile(r"lease \S+ \(request (\S+) on \S+\) done:")
    counts: collections.Counter[str] = collections.Counter()
    for path in log_dir.glob("executor-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            m = done.search(line)
            if m:
                counts[m.group(1)] += 1
    return counts


LOG_SIGNS = {  # what to count in the processes' logs: a pointer for whoever reads the record
    "serve.log": {"silent_executors_dropped": "silent for", "neo4j_unavailable": "Neo4j unavailable",
                  "neo4j_deadlock_retried": "DeadlockDetected", "tracebacks": "Traceback (most recent call last)",
                  "task_exception_never_retrieved": "Task exception was never retrieved"},
    "executor-*.log": {"registrations": "registered executor", "registration_refused": "refused executor",
                       "completions_rejected": "done but rejected", "completions_dropped": "completions refused",
                       "results_given_up": "giving up", "transient_errors": "retrying in"},
}


def log_findings(log_dir: Path) -> dict[str, Any]:
    """Counts of telling lines in the logs, and the distinct exception lines of serve's."""
    out: dict[str, Any] = {}
    for pattern, signs in LOG_SIGNS.items():
        text = "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob(pattern)))
        out[pattern] = {name: text.count(sign) for name, sign in signs.items()}
    serve = (log_dir / "serve.log").read_text(errors="replace") if (log_dir / "serve.log").exists() else ""
    errors = collections.Counter(m.group(0)[:200] for m in re.finditer(r"(?m)^[\w.]+(?:Error|Exception|Unavailable)\b.*$",
                                                                        serve))
    out["serve_exceptions"] = dict(errors.most_common(10))
    return out


def classify(logical: list[Logical], api: dict[str, dict[str, Any]], api_ok: bool, gmg_requests: list[dict[str, Any]],
             gmg_slices: list[dict[str, Any]], completions: collections.Counter[str]) -> dict[str, Any]:
    by_index: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in gmg_requests:
        i = decode_index(list(row["head"] or []))
        if i is not None:
            by_index[i].append(row)
    done_slices: collections.Counter[str] = collections.Counter()
    for row in gmg_slices:
        if row["state"] == "done":
            done_slices[row["uid"]] += int(row["n"])
    gmg_status = {row["uid"]: row["status"] for row in gmg_requests}

    counts: collections.Counter[str] = collections.Counter()
    lost_by: collections.Counter[str] = collections.Counter()
    dup_by: collections.Counter[str] = collections.Counter()
    samples: dict[str, list[Any]] = collections.defaultdict(list)

    def sample(kind: str, item: Any) -> None:
        if len(samples[kind]) < 8:
            samples[kind].append(item)

    for req in logical:
        ids = list(dict.fromkeys([*req.request_ids, *(row["uid"] for row in by_index.get(req.index, []))]))
        if not req.accepted:
            if ids:
                counts["created_without_202"] += 1
                sample("created_without_202", {"index": req.index, "ids": ids, "attempts": len(req.attempts)})
            continue
        info = {"index": req.index, "key": req.key, "ids": ids, "attempts": len(req.attempts)}
        multi_slice = [i for i in ids if done_slices[i] > 1]
        multi_completion = [i for i in ids if completions[i] > 1]
        if len(ids) > 1 or multi_slice or multi_completion:
            counts["duplicated"] += 1
            dup_by["service_requests"] += len(ids) > 1
            dup_by["done_slices"] += bool(multi_slice)
            dup_by["accepted_completions"] += bool(multi_completion) or sum(completions[i] for i in ids) > 1
            sample("duplicated", {**info, "done_slices": {i: done_slices[i] for i in ids},
                                  "accepted_completions": {i: completions[i] for i in ids},
                                  "api_status": {i: api.get(i, {}).get("status") for i in ids}})
            continue
        rid = ids[0]
        status = api.get(rid, {}).get("status") if api_ok else gmg_status.get(rid)
        info.update(request_id=rid, api_status=status, gmg_status=gmg_status.get(rid), done_slices=done_slices[rid])
        if status == "done":
            if gmg_status.get(rid) == "done" and done_slices[rid] == 1:
                counts["done_once"] += 1
            else:
                counts["done_not_durable"] += 1
                sample("done_not_durable", info)
        elif status in OPEN:
            counts["stuck"] += 1
            sample("stuck", info)
        else:
            counts["lost"] += 1
            lost_by[status or "unknown_to_service"] += 1
            sample("lost", info)
    return {"counts": counts, "lost_by_reason": dict(lost_by), "duplicated_by": dict(dup_by), "samples": dict(samples)}


def recovery(faults: list[Fault], logical: list[Logical], api: dict[str, dict[str, Any]], epoch0: float) -> None:
    """Per fault: time from its start to the next 202 of an attempt sent after it
    (``accept_recovery_s``) and to the next completion (``completion_recovery_s``); and the
    service's own part, from the moment the fault is over (the killed process or Neo4j answers
    again: ``ended_s``) to the first 202 answered after it (``accept_after_back_s``: what
    ``results.recovery_s_max`` takes the maximum of; the time Neo4j itself takes to start is not
    the service's)."""
    sends = sorted((a.sent_s, a.done_s) for r in logical for a in r.attempts if a.outcome == "accepted")
    finished = sorted(float(row["finished_at"]) - epoch0 for row in api.values()
                      if row.get("status") == "done" and row.get("finished_at"))
    for f in faults:
        if f.started_s is None:
            continue
        nxt = [done for sent, done in sends if sent >= f.started_s]
        f.detail["accept_recovery_s"] = round(nxt[0] - f.started_s, 2) if nxt else None
        fin = [t for t in finished if t >= f.started_s]
        f.detail["completion_recovery_s"] = round(fin[0] - f.started_s, 2) if fin else None
        back = f.ended_s if f.ended_s is not None else f.started_s
        answered = [done for _, done in sends if done >= back]
        f.detail["accept_after_back_s"] = round(min(answered) - back, 2) if answered else None


# ---- the run ------------------------------------------------------------------------------------------------
def main() -> int:
    p = _record.parser("chaos", __doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=600.0, help="seconds of load over which the faults are spread")
    p.add_argument("--rate", type=float, default=None,
                   help="logical requests per second (Poisson), both tenants (default 2; 3 with --placement slice)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--burst", type=int, default=12,
                   help="requests sent right before each serve kill and Neo4j stop (work in flight when it strikes)")
    p.add_argument("--burst-max-tokens", type=int, default=128)
    p.add_argument("--placement", choices=("container", "replica", "slice"), default="container",
                   help="serve's placement: with slice, executor kills that strike an executor holding a sliced "
                        "guest's leases are counted (results.executor_kills_holding_sliced_guests)")
    p.add_argument("--busy-share", type=float, default=None,
                   help="the share of the arrivals and bursts that go to the first tenant (default: both alike; "
                        f"{SLICE_DEFAULTS['busy_share']} with --placement slice: a busy tenant whose home cannot keep "
                        "up is what the scheduler slices into the other tenant's idle device)")
    p.add_argument("--busy-family", default=None,
                   help="the first tenant's model family, the other's is tiny (default: tiny; "
                        f"{SLICE_DEFAULTS['busy_family']} with --placement slice)")
    p.add_argument("--holder-wait-s", type=float, default=None,
                   help="with --placement slice: how long an executor kill waits for an executor to hold a sliced "
                        f"guest's leases before it strikes the planned target (default {SLICE_DEFAULTS['holder_wait_s']:g})")
    p.add_argument("--executor-kills", type=int, default=24)
    p.add_argument("--serve-kills", type=int, default=3,
                   help="kill -9 of serve, restarted at once (with --leader-kills: of the standby)")
    p.add_argument("--leader-kills", type=int, default=2,
                   help="two serve processes under leader election (service.live.leader), and this many kill -9 of "
                        "the leader: the standby takes over, the killed one comes back as the standby (0: one serve, "
                        "no election)")
    p.add_argument("--leader-ttl-s", type=float, default=3.0, help="the leader's term under election")
    p.add_argument("--neo4j-restarts", type=int, default=3)
    p.add_argument("--neo4j-port-changes", type=int, default=2, help="of the Neo4j restarts, how many move its port")
    p.add_argument("--bad-registrations", type=int, default=2,
                   help="executors registered with one 1-byte device, --bad-gap-s apart")
    p.add_argument("--bad-gap-s", type=float, default=5.0)
    p.add_argument("--neo4j-down-s", type=float, default=3.0, help="seconds Neo4j stays stopped")
    p.add_argument("--client-timeout-s", type=float, default=5.0)
    p.add_argument("--give-up-s", type=float, default=60.0,
                   help="a logical request stops retrying this long after its first attempt")
    p.add_argument("--drain-s", type=float, default=180.0,
                   help="after the load: how long accepted requests get to finish")
    p.add_argument("--lease-ttl-s", type=float, default=5.0)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=48, help="client threads (retrying requests in flight)")
    p.add_argument("--log-dir", type=Path, default=None,
                   help="keep the processes' logs here (default: a new /tmp folder)")
    args = p.parse_args()
    if args.quick:
        args.duration_s, args.executor_kills, args.serve_kills, args.leader_kills = 100.0, 4, 1, 1
        args.neo4j_restarts, args.neo4j_port_changes = 1, 1
        args.drain_s, args.give_up_s = 40.0, 20.0
    args.neo4j_port_changes = min(args.neo4j_port_changes, args.neo4j_restarts)
    apply_placement_defaults(args)
    if args.busy_share is not None and not 0.0 < args.busy_share < 1.0:
        p.error(f"--busy-share {args.busy_share}: a share strictly between 0 and 1")

    def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    import tempfile

    import numpy as np

    from service.harness.stack import LiveStack

    log_dir = args.log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="slicesched-chaos-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    load_rng, fault_rng = np.random.default_rng([args.seed, 0]), np.random.default_rng([args.seed, 1])
    keys = make_keys(args.seed)
    warmup_s, cooldown_s = (10.0, 20.0) if args.quick else (15.0, 60.0)
    counts = {"executor_kill": args.executor_kills, "serve_kill": args.serve_kills, "leader_kill": args.leader_kills,
              "neo4j_restart": args.neo4j_restarts, "bad_registration": args.bad_registrations}
    plan = plan_faults(fault_rng, counts, args.neo4j_port_changes, warmup_s, args.duration_s - cooldown_s,
                       args.bad_gap_s)
    wall0 = time.monotonic()
    print(f"chaos: {len(plan)} faults over {args.duration_s:.0f} s at {args.rate}/s; logs in {log_dir}", flush=True)

    tenants = ["chaos-a", "chaos-b"]
    election = args.leader_kills > 0
    stack = LiveStack(placement=args.placement, admin_key=keys.admin, executor_key=executor_key(keys), managed=True,
                      lease_ttl_s=args.lease_ttl_s, heartbeat_s=args.heartbeat_s, log_dir=log_dir,
                      leader_ttl_s=args.leader_ttl_s if election else None)
    load: Load | None = None
    probe: HealthProbe | None = None
    cluster: Cluster | None = None
    t0 = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t0

    try:
        stack.__enter__()  # closed in the finally below, once nothing can restart a process
        print(f"  Neo4j {stack.neo4j_uri} (managed, state {stack.state_dir}); serve at {stack.url} "
              f"after {time.monotonic() - wall0:.0f} s", flush=True)
        if election:  # before the executors: they are given both addresses
            stack.start_standby(timeout_s=90.0)
            print(f"  standby at http://127.0.0.1:{stack.standby_port} (leader election, {args.leader_ttl_s:g} s terms)",
                  flush=True)
        cluster = Cluster(stack, clock, serve_timeout_s=90.0)
        with cluster.lock:  # they load torch while the models are traced into the GMG
            for name in EXECUTORS:
                cluster.start_executor(name)
        tenant_keys: dict[str, str] = {}
        with stack.client(timeout_s=120.0) as admin:
            for tenant in tenants:
                r = admin.post("/v1/tenants", json={"tenant_id": tenant, "sla_class": "standard"})
                r.raise_for_status()
                tenant_keys[tenant] = r.json()["api_key"]
                family = args.busy_family if tenant == tenants[0] else "tiny"
                admin.post("/v1/catalog/models", json={"model_id": "m", "family": family, "tenant_id": tenant}
                           ).raise_for_status()
        print(f"  tenants and models after {time.monotonic() - wall0:.0f} s", flush=True)
        stack.wait_devices(len(EXECUTORS), timeout_s=120.0)
        print(f"  {len(EXECUTORS)} executors up after {time.monotonic() - wall0:.0f} s of set-up", flush=True)

        t0 = time.monotonic()
        epoch0 = time.time()
        load = Load(stack.url, tenant_keys, load_rng, rate_per_s=args.rate, prompt_len=args.prompt_tokens,
                    max_tokens=args.max_tokens, timeout_s=args.client_timeout_s, give_up_s=args.give_up_s,
                    workers=args.workers, clock=clock, follow=(lambda: stack.url) if election else None,
                    first_share=args.busy_share)
        probe = HealthProbe(stack, clock)
        load.start()
        probe.start()
        cluster.start()
        progress = Progress(stack, load, probe, cluster, plan, clock)
        progress.start()

        for f in plan:
            while clock() < f.planned_s:
                time.sleep(min(0.5, f.planned_s - clock()))
            with cluster.lock:
                f.started_s, f.started_epoch = round(clock(), 2), time.time()
                print(f"  t={clock():6.1f}s fault: {f.kind} {f.target}".rstrip(), flush=True)
                try:
                    inject(f, cluster, keys, fault_rng, load, neo4j_down_s=args.neo4j_down_s, burst=args.burst,
                           burst_max_tokens=args.burst_max_tokens, prefer_sliced=args.placement == "slice",
                           holder_wait_s=args.holder_wait_s)
                    f.ok = True
                except Exception as exc:  # recorded; the run goes on (the supervisor restarts what is down)
                    f.detail["error"] = f"{type(exc).__name__}: {exc}"
                    print(f"    fault failed: {f.detail['error']}", flush=True)
                f.ended_s = f.detail.pop("back_s", None) or round(clock(), 2)
            if f.detail:
                print(f"    {json.dumps({k: v for k, v in f.detail.items() if k != 'answer'})}", flush=True)
        load_end_s = max(args.duration_s, clock() + cooldown_s)
        while clock() < load_end_s:
            time.sleep(min(1.0, load_end_s - clock()))
        load.stop_arrivals()
        submitted_end_s = clock()
        print(f"  t={clock():6.1f}s load stopped; finishing retries (<= {args.give_up_s:.0f} s), then draining "
              f"(<= {args.drain_s:.0f} s)", flush=True)
        load.finish(args.give_up_s + args.client_timeout_s + 5)

        inspector = Inspector(stack, keys.admin)
        drain_deadline = time.monotonic() + args.drain_s
        open_ids: list[str] = []
        while True:
            ids = [rid for r in load.snapshot() for rid in r.request_ids]
            api, _ = inspector.requests([])
            open_ids = [rid for rid in ids if api.get(rid, {}).get("status") not in TERMINAL]
            if api and not any(api.get(rid, {}).get("status") in OPEN for rid in ids):
                break
            if time.monotonic() >= drain_deadline:
                break
            progress.say(f"draining: {len(open_ids)} of {len(ids)} accepted not finished")
            time.sleep(3.0)
        drain_s = clock() - submitted_end_s
        flush_deadline = time.monotonic() + 20.0
        while time.monotonic() < flush_deadline:  # the GMG writer's batches, before reading the GMG
            try:
                if inspector._api("GET", "/v1/stats").json()["gmg_write_lag_s"]["pending"] == 0:
                    break
            except Exception:
                pass
            time.sleep(1.0)
        progress.stop()
        print(f"  t={clock():6.1f}s drain over ({len(open_ids)} not finished); reading the API and the GMG",
              flush=True)

        logical = load.snapshot()
        ids = [rid for r in logical for rid in r.request_ids]
        api, api_note = inspector.requests(ids)
        stale_before = stack.server_started_at
        gmg_requests = inspector.cypher(
            "gmg_requests", params={"tenants": tenants},
            query="MATCH (r:Request) WHERE r.tenant_id IN $tenants AND r.prompt IS NOT NULL "
                  f"RETURN r.uid AS uid, r.prompt[0..{HEAD_TOKENS}] AS head, r.status AS status")
        gmg_slices = inspector.cypher(
            "gmg_slices", params={"tenants": tenants},
            query="MATCH (s:Slice)-[:SERVES]->(r:Request) WHERE r.tenant_id IN $tenants "
                  "RETURN r.uid AS uid, s.state AS state, count(s) AS n")
        violations = inspector.cypher("reconciliation_violations", name="reconciliation_violations",
                                      params={"since": epoch0 - 1.0, "stale_before": stale_before})
        try:
            stats = inspector._api("GET", "/v1/stats").json()
        except Exception as exc:
            stats = {"error": str(exc)}
        probe.stop()
        cluster.stop()
        completions = accepted_completions(log_dir)
        verdict = classify(logical, api, bool(api), gmg_requests, gmg_slices, completions)
        recovery(plan, logical, api, epoch0)
        results = report(args, logical, verdict, violations, plan, probe, cluster, stats, inspector, api_note,
                         {"load_s": round(submitted_end_s, 1), "drain_s": round(drain_s, 1),
                          "total_wall_s": round(time.monotonic() - wall0, 1),
                          "stale_before_epoch": stale_before, "since_epoch": epoch0 - 1.0})
        kill_all(stack)
    finally:
        if load is not None:
            load.close()
        if probe is not None:
            probe.stop()
        if cluster is not None:
            cluster.stop()
        kill_all(stack)
        if cluster is not None and cluster.running():  # it was starting a process: wait, then stop that too
            cluster.stop(timeout_s=120.0)
            kill_all(stack)
        stack.close()
    config = {"duration_s": args.duration_s, "rate_per_s": args.rate, "tenants": tenants, "family": "tiny",
              "busy_family": args.busy_family, "busy_share": args.busy_share, "holder_wait_s": args.holder_wait_s,
              "executors": list(EXECUTORS), "devices_per_executor": 1, "prompt_tokens": args.prompt_tokens,
              "max_tokens": args.max_tokens, "burst": args.burst, "burst_max_tokens": args.burst_max_tokens,
              "lease_ttl_s": args.lease_ttl_s, "heartbeat_s": args.heartbeat_s,
              "client_timeout_s": args.client_timeout_s, "give_up_s": args.give_up_s, "drain_s": args.drain_s,
              "neo4j_down_s": args.neo4j_down_s, "planned_faults": counts,
              "neo4j_port_changes": args.neo4j_port_changes, "bad_gap_s": args.bad_gap_s,
              "serve_mode": "managed (SLICESCHED_STATE, no SLICESCHED_NEO4J_URI)", "placement": args.placement,
              "log_dir": str(log_dir)}
    # the default (container) placement's record is chaos.json; another's is chaos-<placement>.json
    _record.write("chaos" if args.placement == "container" else f"chaos-{args.placement}", args, config, results)
    return 0


def report(args: Any, logical: list[Logical], verdict: dict[str, Any], violations: list[dict[str, Any]],
           plan: list[Fault], probe: HealthProbe, cluster: Cluster, stats: dict[str, Any], inspector: Inspector,
           api_note: str, timing: dict[str, Any]) -> dict[str, Any]:
    c = verdict["counts"]
    outcomes = collections.Counter(a.outcome for r in logical for a in r.attempts)
    faults = collections.Counter({k: 0 for k in ("executor_kill", "serve_kill", "leader_kill", "neo4j_restart",
                                                 "bad_registration")})
    faults.update(f.kind for f in plan if f.ok)
    faults["neo4j_port_change"] = sum(1 for f in plan if f.ok and f.kind == "neo4j_restart"
                                      and f.detail.get("new_port") != f.detail.get("old_port"))
    events = collections.Counter(e["kind"] for e in cluster.events)
    accepted = sum(r.accepted for r in logical)
    recovery_by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({f.kind for f in plan}):
        acc = [f.detail.get("accept_recovery_s") for f in plan if f.kind == kind and f.started_s is not None]
        back = [f.detail.get("accept_after_back_s") for f in plan if f.kind == kind and f.started_s is not None]
        recovery_by_kind[kind] = {"accept_recovery_s_max": max((x for x in acc if x is not None), default=None),
                                  "accept_after_back_s_max": max((x for x in back if x is not None), default=None),
                                  "never_recovered": sum(x is None for x in acc)}
    struck = [f for f in plan if f.started_s is not None]
    after_back: list[float | None] = [f.detail.get("accept_after_back_s") for f in struck]
    results: dict[str, Any] = {
        "submitted": len(logical), "accepted": accepted, "done_once": c["done_once"], "lost": c["lost"],
        "duplicated": c["duplicated"], "stuck": c["stuck"], "reconciliation_violations": len(violations),
        "faults": dict(faults),
        # executor kills that struck an executor holding a sliced guest's leases (placement slice)
        "executor_kills_holding_sliced_guests": sum(1 for f in plan if f.ok and f.kind == "executor_kill"
                                                    and (f.detail.get("sliced_guests_held") or 0) > 0),
        "done_not_durable": c["done_not_durable"],
        # leader election: seconds from a leader's kill -9 to the standby's /readyz 200 (None: no leader kill)
        "leader_takeover_s_max": max((f.detail["takeover_s"] for f in plan if f.ok and f.kind == "leader_kill"
                                      and f.detail.get("takeover_s") is not None), default=None),
        # faults after which no attempt sent was accepted until the load stopped: an outage the service never left
        "faults_never_recovered": sum(1 for f in plan if f.started_s is not None
                                      and f.detail.get("accept_recovery_s") is None),
        "burst_requests": sum(r.burst for r in logical),
        "accounted": c["done_once"] + c["lost"] + c["duplicated"] + c["stuck"] + c["done_not_durable"] == accepted,
        "lost_by_reason": verdict["lost_by_reason"], "duplicated_by": verdict["duplicated_by"],
        "not_accepted": {"gave_up": sum(r.gave_up for r in logical),
                         "rejected_4xx": sum(bool(r.rejected) for r in logical),
                         "created_without_202": c["created_without_202"],
                         "other": sum(not r.accepted and not r.gave_up and not r.rejected for r in logical)},
        "rejected_samples": [r.rejected for r in logical if r.rejected][:5],
        "attempts": {"total": sum(outcomes.values()), "by_outcome": dict(outcomes), "http_503": outcomes["http_503"],
                     "retried_requests": sum(len(r.attempts) > 1 for r in logical)},
        "violations_by_kind": dict(collections.Counter(v["kind"] for v in violations)),
        "violations_sample": violations[:10],
        "samples": verdict["samples"],
        # the service's time to accept again once each fault is over (the process or Neo4j answers
        # again), the worst over every fault (None: some fault was never recovered from); target <= 30
        "recovery_s_max": None if any(x is None for x in after_back)
        else max((x for x in after_back if x is not None), default=0.0),
        "recovery_s": [{"kind": f.kind, "target": f.target, "started_s": f.started_s, "back_s": f.ended_s,
                        "accept_after_back_s": f.detail.get("accept_after_back_s"),
                        "accept_after_strike_s": f.detail.get("accept_recovery_s"),
                        "completion_after_strike_s": f.detail.get("completion_recovery_s")} for f in struck],
        "recovery_by_kind": recovery_by_kind,
        "fault_log": [{"kind": f.kind, "target": f.target, "planned_s": f.planned_s, "started_s": f.started_s,
                       "ended_s": f.ended_s, "ok": f.ok, **f.detail} for f in plan],
        "harness_events": {"by_kind": dict(events), "log": cluster.events[:60]},
        "healthz": probe.summary(),
        "service_counters": stats.get("counters", stats),
        "gmg_write": stats.get("gmg_write_lag_s"),
        "read_from": {**inspector.sources, "api_requests": api_note},
        "logs": log_findings(Path(args.log_dir)),
        **timing,
    }
    return results


class Progress:
    """A line every 10 s: load, completions, faults so far, health."""

    def __init__(self, stack: Any, load: Load, probe: HealthProbe, cluster: Cluster, plan: list[Fault],
                 clock: Any) -> None:
        self.stack, self.load, self.probe, self.cluster = stack, load, probe, cluster
        self.plan, self.clock = plan, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def say(self, text: str) -> None:
        print(f"  t={self.clock():6.1f}s {text}", flush=True)

    def _run(self) -> None:
        import httpx

        while not self._stop.wait(10.0):
            logical = self.load.snapshot()
            try:
                counters = httpx.get(f"{self.stack.url}/v1/stats", timeout=2.0,
                                     headers={"Authorization": f"Bearer {self.stack.admin_key}"}).json()["counters"]
                done = counters.get("leases_completed", "?")
            except (httpx.HTTPError, ValueError, KeyError):
                done = "?"
            faults = sum(f.ended_s is not None for f in self.plan)
            exits = sum(e["kind"] == "executor_exited" for e in self.cluster.events)
            self.say(f"submitted {len(logical)} accepted {sum(r.accepted for r in logical)} "
                     f"leases completed {done} | faults {faults}/{len(self.plan)} | executor exits {exits} "
                     f"| healthz {self.probe.last()}")


if __name__ == "__main__":
    sys.exit(main())
