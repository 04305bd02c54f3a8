"""The testbench's live side: one ``slicesched serve`` and one executor daemon, kept running while
every policy is served in turn.

:class:`LiveBench` starts the stack (:class:`~service.harness.stack.LiveStack`: real processes on
loopback, the model run with PyTorch by the executor on one CPU device), registers the testbench's
tenant and model, and warms up: a first round of requests loads the model and picks kernels
(untimed), a second one measures what the replica serves with every KV slot busy (output tokens
per second, and the mean iteration time the executor reports). :meth:`LiveBench.probe_control_plane`
then sends lone requests to the idle replica, one after another, and reads the control plane's two
delays off the service's records (:class:`~service.harness.testbench.predict.ControlPlane`). :meth:`LiveBench.run` switches the
service's queue policy (``PUT /v1/queue-policy``: no restart, the executor keeps its model
resident), submits the workload's requests at their arrival times (their own priority and SLO
targets as headers) and waits until every one is done; the figures are what the service
recorded (TTFT and end-to-end latency from its arrival, which include the wait for a lease).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import httpx

from executor.settings import Settings
from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from service.harness.testbench.metrics import Outcome
from service.harness.testbench.predict import ControlPlane, Devices
from service.harness.testbench.workload import TENANT, BenchRequest, BenchWorkload

Say = Callable[[str], None]
EXECUTOR = "bench-exec"
DEVICE = "cpu:0"
#: How often the bench's executor (default settings) polls for leases while it runs some.
EXECUTOR_BUSY_POLL_S: float = next(f.default for f in fields(Settings) if f.name == "busy_poll_s")  # type: ignore[assignment]
SUBMITTERS = 4  # client threads: a slow answer (the request is written to Neo4j first) delays no later arrival


@dataclass(frozen=True)
class WarmUp:
    requests: int
    tokens_per_s: float  # output tokens per second with every KV slot busy
    iteration_s: float | None  # the executor's mean iteration time (the service's EWMA); None: none reported
    seconds: float


@dataclass(frozen=True)
class LiveRun:
    policy: str
    outcomes: list[Outcome]  # by workload position
    output_ids_digest: str  # of every request's output token ids, in workload order
    max_submit_lag_s: float  # worst delay of a submission behind its arrival time
    iteration_s: float | None  # the service's mean iteration time after the run
    load_avg_1m: tuple[float, float]  # at the start and at the end
    wall_s: float


class LiveBench:
    """The live stack of a testbench (a context manager; everything it started stops on exit)."""

    def __init__(self, model: str, *, neo4j: Neo4jSettings | None, max_batch: int = 8, cost_model: str | None = None,
                 say: Say = print) -> None:
        self.model = model
        self.max_batch = max_batch
        self.say = say
        env = {"SLICESCHED_COST_MODEL": cost_model} if cost_model else {}
        self.stack = LiveStack(neo4j=neo4j, queue="fifo", lease_ttl_s=10.0, heartbeat_s=1.0, max_batch=max_batch,
                               extra_env=env)
        self.key = ""
        self.devices: Devices = ()

    def __enter__(self) -> LiveBench:
        started = time.monotonic()
        self.stack.__enter__()
        try:
            # the executor starts (imports torch) while the tenant and its model are registered
            self.stack.start_executor(EXECUTOR, [DEVICE], extra=["--max-batch", str(self.max_batch)])
            with self.stack.client(timeout_s=120.0) as admin:
                r = admin.post("/v1/tenants", json={"tenant_id": TENANT, "sla_class": "standard"})
                if r.status_code == 409:
                    raise RuntimeError(f"tenant {TENANT} already exists in this Neo4j: delete it first")
                r.raise_for_status()
                self.key = r.json()["api_key"]
                admin.post("/v1/catalog/models", json={"model_id": "m", "family": self.model, "tenant_id": TENANT}
                           ).raise_for_status()
                found = self.stack.wait_devices(1)
            self.devices = tuple((d["device_id"], d["executor_id"], d["kind"], int(d["mem_bytes"])) for d in found)
        except BaseException:
            self.stack.close()
            raise
        self.say(f"live: serve at {self.stack.url}, executor {EXECUTOR} on {DEVICE} ({self.model}, "
                 f"{self.max_batch} KV slots), up in {time.monotonic() - started:.0f}s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.stack.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=60.0)

    def stats(self) -> dict[str, Any]:
        with self.stack.client() as admin:
            out: dict[str, Any] = admin.get("/v1/stats").raise_for_status().json()
            return out

    def iteration_s(self) -> float | None:
        value = self.stats()["iteration_s"].get(self.model)
        return float(value) if value else None

    # ---- warm-up ---------------------------------------------------------------------------------
    def warm_up(self, *, prompt_tokens: int = 24, output_tokens: int = 32) -> WarmUp:
        """Two rounds of requests sent at once: ``max_batch`` of them load the model (untimed), then
        ``3 * max_batch`` measure the replica with every KV slot busy."""
        started = time.monotonic()
        n = 3 * self.max_batch
        for round_, size in (("load", self.max_batch), ("measure", n)):
            rows = self._burst(size, prompt_tokens, output_tokens)
            self.say(f"warm-up ({round_}): {size} requests of {prompt_tokens}+{output_tokens} tokens done")
        first = min(r["arrival"] for r in rows)
        last = max(r["finished_at"] for r in rows)
        tokens = sum(len(r["output_tokens"]) for r in rows)
        return WarmUp(n, tokens / max(1e-9, last - first), self.iteration_s(), time.monotonic() - started)

    def _burst(self, n: int, prompt_tokens: int, output_tokens: int) -> list[dict[str, Any]]:
        with self.client() as c:
            ids = [c.post("/v1/requests", json={"model_id": "m", "prompt_tokens": [1 + i % 200] * prompt_tokens,
                                                "max_tokens": output_tokens}).raise_for_status().json()["request_id"]
                   for i in range(n)]
            return self._wait(c, ids, lambda done: None)

    def _wait(self, c: httpx.Client, ids: list[str], tick: Callable[[int], None],
              timeout_s: float = 600.0) -> list[dict[str, Any]]:
        """The requests' records once all are done (in ``ids`` order)."""
        deadline = time.monotonic() + timeout_s
        want = set(ids)
        while True:
            rows = c.get("/v1/requests", params={"limit": len(ids)}).raise_for_status().json()
            mine = {r["request_id"]: r for r in rows if r["request_id"] in want}
            done = sum(r["status"] == "done" for r in mine.values())
            bad = [r for r in mine.values() if r["status"] in ("failed", "cancelled")]
            if bad:
                raise RuntimeError(f"request {bad[0]['request_id']} {bad[0]['status']}: {bad[0].get('error')}")
            if done == len(ids) and len(mine) == len(ids):
                return [mine[i] for i in ids]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ids) - done} of {len(ids)} requests unfinished after {timeout_s:.0f}s: "
                                   f"see {self.stack.log_dir}")
            tick(done)
            time.sleep(0.25)

    def probe_control_plane(self, *, requests: int = 8, prompt_tokens: int = 24, output_tokens: int = 8,
                            timeout_s: float = 60.0) -> tuple[ControlPlane, list[dict[str, float]]]:
        """Send ``requests`` lone requests to the idle replica, each once the one before has ended
        at the service, and read the control plane off the service's records: a lone request's
        ``queued_s`` is its dispatch (arrival to admission into the batch), and the time from its
        last token (``arrival + e2e_s``) to when it shows done (its completion written, its lease
        ended) its release; ``recorded_s`` (to the ``finished_at`` the service stamps before the
        durable write) is kept beside it. Returns the medians and each request's figures."""
        samples: list[dict[str, float]] = []
        poll_s = 0.005
        with self.client() as c:
            for i in range(requests):
                time.sleep(0.05)  # the executor back in its long poll, nothing in flight
                rid = c.post("/v1/requests", json={"model_id": "m", "prompt_tokens": [1 + (7 * i) % 200] * prompt_tokens,
                                                   "max_tokens": output_tokens}).raise_for_status().json()["request_id"]
                deadline = time.monotonic() + timeout_s
                while True:
                    row = c.get(f"/v1/requests/{rid}").raise_for_status().json()
                    seen = time.time()  # the service's wall clock too (one machine)
                    if row["status"] == "done":
                        break
                    if row["status"] in ("failed", "cancelled") or time.monotonic() > deadline:
                        raise RuntimeError(f"control-plane probe: request {rid} {row['status']}: see {self.stack.log_dir}")
                    time.sleep(poll_s)
                last_token = float(row["arrival"]) + float(row["e2e_s"])
                # the lease ends (its slot is free to grant) when the request shows done, after the
                # durable write; seen between two polls, so half a poll is taken off
                samples.append({"dispatch_s": float(row["queued_s"]),
                                "release_s": max(0.0, seen - poll_s / 2 - last_token),
                                "recorded_s": max(0.0, float(row["finished_at"]) - last_token),
                                "ttft_s": float(row["ttft_s"]), "e2e_s": float(row["e2e_s"])})
        median = statistics.median
        return ControlPlane(median(s["dispatch_s"] for s in samples), median(s["release_s"] for s in samples),
                            len(samples), poll_s=EXECUTOR_BUSY_POLL_S), samples

    # ---- one policy --------------------------------------------------------------------------------
    def set_policy(self, queue: str, params: dict[str, float]) -> None:
        with self.stack.client() as admin:
            r = admin.put("/v1/queue-policy", json={"queue": queue, "params": params})
            if r.status_code != 200:
                raise RuntimeError(f"PUT /v1/queue-policy {queue}: {r.status_code} {r.text}")

    def run(self, label: str, queue: str, params: dict[str, float], workload: BenchWorkload) -> LiveRun:
        """Serve ``workload`` with the queue policy ``queue``; ``label`` names it in progress lines."""
        self.set_policy(queue, params)
        load_start = os.getloadavg()[0]
        start = time.monotonic() + 0.2
        with self.client() as c:
            ids, lags = self._submit(c, label, workload, start)
            noted = [0.0]  # when the last progress line was printed

            def tick(done: int) -> None:
                if time.monotonic() - noted[0] > 3.0:
                    noted[0] = time.monotonic()
                    self.say(f"  {label}: {time.monotonic() - start:4.0f}s  draining, {done}/{len(ids)} done")

            rows = self._wait(c, ids, tick)
        first = min(r["arrival"] for r in rows)
        outcomes = [Outcome(i, r["arrival"] - first, float(r["ttft_s"]), float(r["e2e_s"]), len(r["output_tokens"]),
                            float(r["queued_s"])) for i, r in enumerate(rows)]
        digest = hashlib.sha256(json.dumps([r["output_tokens"] for r in rows]).encode()).hexdigest()
        return LiveRun(label, outcomes, digest, max(lags, default=0.0), self.iteration_s(),
                       (load_start, os.getloadavg()[0]), time.monotonic() - start)

    def _submit(self, c: httpx.Client, label: str, workload: BenchWorkload, start: float
                ) -> tuple[list[str], list[float]]:
        """Send every request at ``start`` + its arrival time; returns the request ids in workload
        order and each submission's lag behind its arrival time."""
        ids: list[str | None] = [None] * len(workload.requests)
        lags: list[float] = []
        errors: list[BaseException] = []

        def post(i: int, req: BenchRequest) -> None:
            try:
                lags.append(time.monotonic() - (start + req.spec.arrival_s))
                r = c.post("/v1/requests", headers=req.headers(),
                           json={"model_id": "m", "prompt_tokens": list(req.prompt), "max_tokens": req.spec.output_tokens})
                r.raise_for_status()
                ids[i] = r.json()["request_id"]
            except BaseException as exc:  # raised in the caller's thread below
                errors.append(exc)

        noted = time.monotonic()
        with ThreadPoolExecutor(SUBMITTERS, thread_name_prefix="testbench-submit") as pool:
            for i, req in enumerate(workload.requests):
                delay = start + req.spec.arrival_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(post, i, req)
                if time.monotonic() - noted > 3.0:
                    noted = time.monotonic()
                    self.say(f"  {label}: {noted - start:4.0f}s  submitted {i + 1}/{len(ids)}")
        if errors:
            raise RuntimeError(f"{label}: a submission failed: {errors[0]}") from errors[0]
        return [i for i in ids if i is not None], lags
