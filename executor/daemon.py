"""The executor daemon: ``slicesched executor --server URL --devices cpu:0,cpu:1``.

It registers its devices with the service, long-polls leases, runs each lease's request in
the continuous batcher of its replica and posts a completion when the request finishes (the
protocol is in ``docs/API.md``). Two parts:

* :class:`Worker`: the torch side, no network. Leases in, completions out. One
  :class:`~executor.batcher.ContinuousBatcher` per replica; a model is built once per
  ``(family, seed, stages)`` and stays resident. A round steps every non-idle batcher once.
* :class:`ExecutorDaemon`: the protocol. The main thread polls, runs the worker's rounds and
  posts results; a heartbeat thread renews the held leases every ``heartbeat_s`` and passes
  the service's cancellations (and its drain flag) to the main thread.

A replica's batcher has ``max_batch`` KV slots (the service never leases a replica more); the
daemon holds at most ``2 * max_batch`` leases per device (it polls for the free slots only), so
a lease joins its batcher at the next iteration. Transient failures (network, 5xx)
are logged and retried with backoff; results that could not be posted wait for the next
attempt. A 4xx on registration is fatal (:class:`RegisterRefused`). SIGTERM or SIGINT stops
polling, finishes the held leases, posts their results, deregisters and exits 0; a second
signal abandons the leases (the service re-queues them when the executor leaves).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import FrameType
from typing import Any

import httpx
import torch

from executor.batcher import Clock, ContinuousBatcher, GenerationRequest
from executor.device import torch_device
from executor.runner import Stage, StagedModel, load_staged
from service.domain.error import EXIT_BAD_INPUT, ApiError, RegisterRefused, TransientError

log = logging.getLogger("slicesched.executor")

IDLE_PAUSE_S = 0.2  # how long the main loop sleeps when it has nothing to do and polls nothing
ITERATION_HISTORY = 1024  # iteration records kept per batcher (the daemon reports per request)

ModelKey = tuple[str, int, tuple[Stage, ...]]
ModelLoader = Callable[[str, int, Sequence[Stage]], StagedModel]


# ---- leases and results -------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    """One request to run on one placement, as the service hands it out (see docs/API.md)."""

    lease_id: str
    request_id: str
    replica_id: str
    family: str
    seed: int
    stages: tuple[Stage, ...]
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    received_s: float  # on the worker's clock: the origin of queued_s, ttft_s and e2e_s

    @staticmethod
    def from_json(raw: Mapping[str, Any], received_s: float) -> Lease:
        """Parse a lease; ``KeyError``, ``TypeError`` or ``ValueError`` if it is malformed.
        A missing or null ``seed`` is 0, ``build_model``'s default."""
        return Lease(
            lease_id=str(raw["lease_id"]),
            request_id=str(raw["request_id"]),
            replica_id=str(raw["replica_id"]),
            family=str(raw["family"]),
            seed=int(raw.get("seed") or 0),
            stages=tuple(Stage.from_dict(s) for s in raw["stages"]),
            prompt_tokens=tuple(int(t) for t in raw["prompt_tokens"]),
            max_tokens=int(raw["max_tokens"]),
            received_s=received_s,
        )

    @property
    def model_key(self) -> ModelKey:
        """Leases with equal keys run the very same weights placed the same way."""
        return (self.family, self.seed, self.stages)


@dataclass(frozen=True)
class Completion:
    """The result of a finished lease, in the API's form (times in seconds from lease receipt)."""

    lease_id: str
    output_tokens: list[int]
    queued_s: float  # received -> admitted into the batch
    ttft_s: float  # received -> first token
    e2e_s: float  # received -> last token
    iterations: int
    busy_s: float  # sum of the durations of the iterations the request took part in
    peak_bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Failure:
    """A lease this executor cannot run; the service puts its request back in the queue."""

    lease_id: str
    reason: str


@dataclass
class RoundResult:
    completed: list[tuple[Lease, Completion]] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)


def completion_of(lease: Lease, request: GenerationRequest) -> Completion:
    """The completion of ``lease`` whose request the batcher has finished."""
    if request.admitted_s is None or request.first_token_s is None or request.finished_s is None:
        raise ValueError(f"lease {lease.lease_id}: its request has not finished")
    origin = lease.received_s
    return Completion(
        lease_id=lease.lease_id,
        output_tokens=list(request.tokens),
        queued_s=request.admitted_s - origin,
        ttft_s=request.first_token_s - origin,
        e2e_s=request.finished_s - origin,
        iterations=request.iterations,
        busy_s=request.busy_s,
        peak_bytes=request.peak_bytes,
    )


# ---- the torch side -----------------------------------------------------------------------------
class Worker:
    """Runs leases in continuous batchers, one per replica; no network, main thread only.

    ``accept`` submits a lease's request (``ValueError`` or a domain error if it cannot run
    here), ``cancel`` drops it, ``step_round`` steps every non-idle batcher once and returns
    what finished. Requests are keyed by lease id in the batchers.
    """

    def __init__(self, *, max_batch: int = 8, max_held: int | None = None, clock: Clock = time.perf_counter,
                 loader: ModelLoader = load_staged) -> None:
        self.max_batch = max_batch  # KV slots of one replica's batcher
        self.max_held = max_held or max_batch  # leases held at once, all replicas
        self.clock = clock
        self._loader = loader
        self._models: dict[ModelKey, StagedModel] = {}
        self._batchers: dict[tuple[str, ModelKey], ContinuousBatcher] = {}
        self._held: dict[str, tuple[Lease, ContinuousBatcher]] = {}
        self.busy_s = 0.0  # wall seconds spent in iterations, all replicas (the service's utilisation)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_held - len(self._held))

    @property
    def busy(self) -> bool:
        return bool(self._held)

    @property
    def lease_ids(self) -> list[str]:
        return list(self._held)

    def accept(self, lease: Lease) -> bool:
        """Submit ``lease``'s request into its replica's batcher; ``False`` if already held."""
        if lease.lease_id in self._held:
            return False
        batcher = self._batcher_for(lease)
        batcher.submit(GenerationRequest(lease.lease_id, list(lease.prompt_tokens), lease.max_tokens,
                                         arrival_s=lease.received_s))
        self._held[lease.lease_id] = (lease, batcher)
        return True

    def cancel(self, lease_id: str) -> bool:
        """Drop a held lease from its batcher; ``False`` if it is not held (e.g. finished)."""
        held = self._held.pop(lease_id, None)
        if held is None:
            return False
        held[1].remove(lease_id)
        return True

    def step_round(self) -> RoundResult:
        """One iteration of every non-idle batcher, round robin. A batcher whose step raises
        (e.g. out of memory) is dropped and its leases fail: its state is no longer trusted."""
        result = RoundResult()
        for key, batcher in list(self._batchers.items()):
            if batcher.idle:
                continue
            try:
                record = batcher.step()
            except Exception as exc:
                log.exception("replica %s failed an iteration; failing its leases", key[0])
                del self._batchers[key]
                result.failed.extend(self._drop_leases_of(batcher, f"executor error: {exc}"))
                continue
            if record is not None:
                self.busy_s += record.duration_s
            for request in batcher.take_finished():
                lease, _ = self._held.pop(request.request_id)
                result.completed.append((lease, completion_of(lease, request)))
        return result

    def _drop_leases_of(self, batcher: ContinuousBatcher, reason: str) -> list[Failure]:
        lease_ids = [lid for lid, (_, b) in self._held.items() if b is batcher]
        for lid in lease_ids:
            del self._held[lid]
        return [Failure(lid, reason) for lid in lease_ids]

    def _batcher_for(self, lease: Lease) -> ContinuousBatcher:
        key = (lease.replica_id, lease.model_key)
        if key not in self._batchers:
            model = self._models.get(lease.model_key)
            if model is None:
                model = self._loader(lease.family, lease.seed, lease.stages)
                self._models[lease.model_key] = model
                log.info("loaded %s (seed %d) on %s", lease.family, lease.seed,
                         ", ".join(f"{s.device_id}[{s.start}:{s.end})" for s in lease.stages))
            self._batchers[key] = ContinuousBatcher(model, max_batch=self.max_batch, clock=self.clock,
                                                    history=ITERATION_HISTORY)
        return self._batchers[key]


# ---- the protocol -------------------------------------------------------------------------------
class Backoff:
    """Exponential backoff after failures: ``ready`` says whether to try again now."""

    def __init__(self, clock: Clock, *, base_s: float = 0.5, max_s: float = 10.0) -> None:
        self.clock = clock
        self.base_s, self.max_s = base_s, max_s
        self._delay = 0.0
        self._next = 0.0

    def ready(self) -> bool:
        return self.clock() >= self._next

    def failed(self) -> float:
        """Record a failure; returns the delay before the next attempt."""
        self._delay = min(self.max_s, self._delay * 2 or self.base_s)
        self._next = self.clock() + self._delay
        return self._delay

    def succeeded(self) -> None:
        self._delay, self._next = 0.0, 0.0


@dataclass(frozen=True)
class Settings:
    server: str  # base URL of the service
    key: str  # executor (or admin) key
    executor_id: str
    host_id: str
    devices: tuple[dict[str, Any], ...]  # [{device_id, kind, mem_bytes}] as registered
    max_batch: int = 8
    poll_wait_s: float = 2.0  # long-poll wait while idle
    busy_poll_s: float = 0.05  # while running, poll (without waiting) at most this often
    timeout_s: float = 10.0  # per call, on top of a long poll's wait
    retry_base_s: float = 0.5  # first delay after a transient failure (doubling up to 10 s)
    stage_url: str | None = None  # this node's stage server, for drivers on other nodes (executor.remote)


class _Mailbox:
    """What the heartbeat thread and the main thread hand each other: lease lists under a
    lock, flags as plain booleans (each write a single assignment)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: list[str] = []
        self._cancel: list[str] = []
        self.service_drain = False
        self.needs_register = False
        self.busy_s = 0.0  # the worker's total iteration time, published by the main thread

    def publish_running(self, lease_ids: list[str]) -> None:
        with self._lock:
            self._running = list(lease_ids)

    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def post_cancel(self, lease_ids: list[str]) -> None:
        with self._lock:
            self._cancel.extend(lease_ids)

    def take_cancel(self) -> list[str]:
        with self._lock:
            taken, self._cancel = self._cancel, []
            return taken


class ExecutorDaemon:
    """Registers, polls, runs and reports leases until stopped (see the module docstring).

    ``run`` blocks in the calling thread (it must be the one that owns the torch work) and
    returns 0 after a drain; it raises :class:`RegisterRefused` when the service refuses the
    registration. ``request_stop`` (the signal handler) starts the drain; a second call
    abandons the held leases. ``transport`` replaces the network (tests).
    """

    def __init__(self, settings: Settings, *, clock: Clock = time.perf_counter,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self.clock = clock
        # A replica's batcher has max_batch KV slots; the executor holds enough leases to fill one
        # batcher per device twice over (the service caps leases per replica at its KV slots).
        self.worker = Worker(max_batch=settings.max_batch, max_held=2 * settings.max_batch * len(settings.devices),
                             clock=clock)
        self._transport = transport
        self.lease_ttl_s = 30.0
        self.heartbeat_s = 5.0
        self._mailbox = _Mailbox()
        self._stop = threading.Event()  # drain: no more polling
        self._abort = threading.Event()  # leave now
        self._wake = threading.Event()  # interrupts pauses
        self._finished = threading.Event()  # ends the heartbeat thread
        self._poll_backoff = Backoff(clock, base_s=settings.retry_base_s)
        self._post_backoff = Backoff(clock, base_s=settings.retry_base_s)
        self._register_backoff = Backoff(clock, base_s=settings.retry_base_s)
        self._last_poll_s = -float("inf")
        self._last_contact_s = clock()
        self._completions: list[tuple[Lease, Completion]] = []
        self._failures: list[Failure] = []

    # ---- lifecycle ------------------------------------------------------------------------------
    def run(self) -> int:
        with self._client() as client:
            if not self._register_until_done(client):
                return 0  # stopped before it could register: it holds nothing
            heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
            heartbeat.start()
            try:
                self._loop(client)
            finally:
                self._finished.set()
                heartbeat.join()
                self._deregister(client)
        return 0

    def request_stop(self) -> None:
        """First call: drain (finish the held leases, then leave). Second call: leave now."""
        if self._stop.is_set():
            log.warning("second stop: abandoning %d lease(s)", len(self._mailbox.running()))
            self._abort.set()
        else:
            log.info("stopping: finishing the held leases first (signal again to abandon them)")
            self._stop.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT call :meth:`request_stop` (call from the main thread)."""
        def handler(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _client(self) -> httpx.Client:
        s = self.settings
        return httpx.Client(base_url=s.server, headers={"Authorization": f"Bearer {s.key}"},
                            timeout=s.timeout_s, transport=self._transport)

    def _call(self, client: httpx.Client, method: str, path: str, body: Any = None,
              timeout_s: float | None = None) -> dict[str, Any]:
        """One API call: the JSON answer, :class:`ApiError` on a 4xx, :class:`TransientError`
        on anything that may pass."""
        try:
            response = client.request(method, path, json=body, timeout=timeout_s or self.settings.timeout_s)
        except httpx.TransportError as exc:
            raise TransientError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise TransientError(f"{method} {path}: {response.status_code} {_error_message(response)}")
        if response.status_code >= 400:
            raise ApiError(response.status_code, _error_message(response))
        self._last_contact_s = self.clock()
        if not response.content:
            return {}
        try:
            answer = response.json()
        except ValueError as exc:
            raise TransientError(f"{method} {path}: the answer is not JSON") from exc
        return answer if isinstance(answer, dict) else {}

    # ---- registration ---------------------------------------------------------------------------
    def _register_until_done(self, client: httpx.Client) -> bool:
        """Register, retrying transient failures until it succeeds (True) or a stop (False)."""
        while not self._stop.is_set():
            if self._register_once(client):
                return True
            self._pause(self._register_backoff.failed())
        return False

    def _register_once(self, client: httpx.Client) -> bool:
        """One registration attempt: True when registered, False on a transient failure."""
        s = self.settings
        body = {"executor_id": s.executor_id, "host_id": s.host_id, "devices": list(s.devices),
                "stage_url": s.stage_url}
        try:
            answer = self._call(client, "POST", "/v1/executors", body)
        except TransientError as exc:
            log.warning("register: %s", exc)
            return False
        except ApiError as exc:
            raise RegisterRefused(f"the service at {s.server} refused executor {s.executor_id}: {exc}") from exc
        self.lease_ttl_s = float(answer.get("lease_ttl_s", self.lease_ttl_s))
        self.heartbeat_s = float(answer.get("heartbeat_s", self.heartbeat_s))
        self._mailbox.needs_register = False
        self._register_backoff.succeeded()
        log.info("registered executor %s (%s) at %s: heartbeat every %.1f s, lease ttl %.1f s", s.executor_id,
                 ", ".join(d["device_id"] for d in s.devices), s.server, self.heartbeat_s, self.lease_ttl_s)
        return True

    def _deregister(self, client: httpx.Client) -> None:
        try:
            self._call(client, "DELETE", f"/v1/executors/{self.settings.executor_id}")
        except (TransientError, ApiError) as exc:
            log.warning("deregister: %s", exc)
        else:
            log.info("deregistered executor %s", self.settings.executor_id)

    # ---- the main loop --------------------------------------------------------------------------
    def _loop(self, client: httpx.Client) -> None:
        while not self._abort.is_set():
            for lease_id in self._mailbox.take_cancel():
                if self.worker.cancel(lease_id):
                    log.info("lease %s cancelled by the service", lease_id)
            if self._mailbox.needs_register and self._register_backoff.ready() and not self._register_once(client):
                self._register_backoff.failed()
            if self._stop.is_set() and not self.worker.busy and self._drained_or_unreachable():
                return
            polled = self._poll(client)
            result = self.worker.step_round()
            self._mailbox.publish_running(self.worker.lease_ids)
            self._mailbox.busy_s = self.worker.busy_s
            self._completions.extend(result.completed)
            self._failures.extend(result.failed)
            self._post_results(client)
            # Heartbeats renew what this executor holds: running leases and finished ones whose
            # completion the service has not yet accepted (a Neo4j outage can delay that).
            self._mailbox.publish_running(self.worker.lease_ids + [lease.lease_id for lease, _ in self._completions])
            if not self.worker.busy and not polled:
                self._pause(IDLE_PAUSE_S)

    def _drained_or_unreachable(self) -> bool:
        """While stopping with nothing running: True when every result is posted, or when the
        service has not answered for a lease ttl (the leases have expired: results are moot)."""
        unsent = len(self._completions) + len(self._failures)
        if not unsent:
            return True
        if self.clock() - self._last_contact_s > self.lease_ttl_s:
            log.error("giving up %d unposted result(s): no answer from the service for %.0f s",
                      unsent, self.clock() - self._last_contact_s)
            return True
        return False

    def _pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a stop request ends it early."""
        self._wake.wait(seconds)
        self._wake.clear()

    def _poll(self, client: httpx.Client) -> bool:
        """Poll for as many leases as there are free slots (waiting only while idle) and
        submit them. True when a poll was answered."""
        s, free = self.settings, self.worker.free_slots
        if self._stop.is_set() or self._mailbox.service_drain or self._mailbox.needs_register or free == 0:
            return False
        busy = self.worker.busy
        if not self._poll_backoff.ready() or (busy and self.clock() - self._last_poll_s < s.busy_poll_s):
            return False
        wait_s = 0.0 if busy else s.poll_wait_s
        body = {"executor_id": s.executor_id, "max_leases": free, "wait_s": wait_s}
        self._last_poll_s = self.clock()
        try:
            answer = self._call(client, "POST", "/v1/leases/poll", body, timeout_s=wait_s + s.timeout_s)
        except (TransientError, ApiError) as exc:
            self._on_call_error("poll", exc, self._poll_backoff)
            return False
        self._poll_backoff.succeeded()
        received_s = self.clock()
        for raw in answer.get("leases", []):
            self._take(raw, received_s)
        self._mailbox.publish_running(self.worker.lease_ids)
        self._mailbox.busy_s = self.worker.busy_s
        return True

    def _take(self, raw: Any, received_s: float) -> None:
        """Submit one polled lease to the worker; a lease that cannot run here is failed."""
        try:
            lease = Lease.from_json(raw, received_s)
        except (KeyError, TypeError, ValueError) as exc:
            lease_id = raw.get("lease_id") if isinstance(raw, dict) else None
            log.error("malformed lease %s: %r", lease_id, exc)
            if lease_id is not None:
                self._failures.append(Failure(str(lease_id), f"malformed lease: {exc!r}"))
            return
        try:
            if not self.worker.accept(lease):
                log.warning("lease %s received twice: ignored", lease.lease_id)
        except Exception as exc:  # unknown family, bad stages, too long, out of memory building it
            log.error("lease %s (request %s) cannot run here: %s", lease.lease_id, lease.request_id, exc)
            self._failures.append(Failure(lease.lease_id, str(exc)))

    def _on_call_error(self, what: str, exc: Exception, backoff: Backoff) -> None:
        """Log a failed call and back off; a 404 means this executor is unknown: register again."""
        delay = backoff.failed()
        if isinstance(exc, ApiError) and exc.status == 404:
            self._mailbox.needs_register = True
            log.warning("%s: %s; registering again", what, exc)
        else:
            log.warning("%s: %s; retrying in %.1f s", what, exc, delay)

    def _post_results(self, client: httpx.Client) -> None:
        """Post the finished leases' completions (all in one call) and the failed leases.
        Transient failures keep them for a later attempt; a 4xx drops them (logged)."""
        if not (self._completions or self._failures) or not self._post_backoff.ready():
            return
        try:
            if self._completions:
                self._post_completions(client)
            while self._failures:
                failure = self._failures[0]
                try:
                    self._call(client, "POST", f"/v1/leases/{failure.lease_id}/fail", {"reason": failure.reason})
                except ApiError as exc:
                    log.warning("fail of lease %s refused: %s", failure.lease_id, exc)
                self._failures.pop(0)
        except TransientError as exc:
            self._on_call_error("post results", exc, self._post_backoff)
            return
        self._post_backoff.succeeded()

    def _post_completions(self, client: httpx.Client) -> None:
        body = {"executor_id": self.settings.executor_id, "results": [c.to_json() for _, c in self._completions]}
        try:
            answer = self._call(client, "POST", "/v1/leases/complete", body)
        except ApiError as exc:
            log.error("completions refused (%s): dropping %d", exc, len(self._completions))
            if exc.status == 404:
                self._mailbox.needs_register = True
            self._completions.clear()
            return
        rejected = {r.get("lease_id"): r.get("reason") for r in answer.get("rejected", []) if isinstance(r, dict)}
        for lease, c in self._completions:
            if lease.lease_id in rejected:
                log.warning("lease %s (request %s) done but rejected: %s", lease.lease_id, lease.request_id,
                            rejected[lease.lease_id])
            else:
                log.info("lease %s (request %s on %s) done: %d tokens, ttft %.3f s, e2e %.3f s, %d iterations",
                         lease.lease_id, lease.request_id, lease.replica_id, len(c.output_tokens), c.ttft_s, c.e2e_s,
                         c.iterations)
        self._completions.clear()

    # ---- the heartbeat thread -------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        with self._client() as client:
            while not self._finished.wait(self.heartbeat_s):
                self.heartbeat(client)

    def heartbeat(self, client: httpx.Client) -> None:
        """Renew the held leases; hand the service's cancellations and drain flag to the main
        thread. A lease missing from ``renewed`` is left running: the service decides
        whether its completion counts."""
        path = f"/v1/executors/{self.settings.executor_id}/heartbeat"
        try:
            answer = self._call(client, "POST", path, {"running": self._mailbox.running(), "busy_s": self._mailbox.busy_s})
        except TransientError as exc:
            log.warning("heartbeat: %s", exc)
            return
        except ApiError as exc:
            if exc.status == 404:
                self._mailbox.needs_register = True
            log.warning("heartbeat: %s", exc)
            return
        self._mailbox.post_cancel([str(x) for x in answer.get("cancel", [])])
        drain = bool(answer.get("drain", False))
        if drain != self._mailbox.service_drain:
            log.info("the service %s this executor", "drains" if drain else "no longer drains")
        self._mailbox.service_drain = drain
        self._wake.set()


def _error_message(response: httpx.Response) -> str:
    """The message of an API error body ``{"error": {"kind", "message"}}``, else the raw text."""
    try:
        error = response.json()["error"]
        return f"{error['kind']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase


# ---- devices and the command --------------------------------------------------------------------
def describe_devices(device_ids: Sequence[str], mem_gib: float | None) -> list[dict[str, Any]]:
    """The registration entries of ``device_ids``: kind ``cpu`` or the CUDA device's name;
    ``mem_bytes`` from ``mem_gib`` if given, else the CUDA device's memory or, for CPU
    devices, the host's memory shared evenly between them. ``ValueError`` for an unknown,
    unavailable or repeated device."""
    if len(set(device_ids)) != len(device_ids):
        raise ValueError(f"devices repeat: {', '.join(device_ids)}")
    n_cpu = sum(torch_device(d).type == "cpu" for d in device_ids)
    entries = []
    for device_id in device_ids:
        device = torch_device(device_id)
        if device.type == "cuda":
            kind, mem = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
        else:
            kind, mem = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n_cpu
        entries.append({"device_id": device_id, "kind": kind,
                        "mem_bytes": int(mem_gib * 2**30) if mem_gib is not None else int(mem)})
    return entries


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slicesched executor",
                                description="Run leases from a slicesched service on this node's devices.")
    p.add_argument("--server", required=True, help="base URL of the service, e.g. http://127.0.0.1:8000")
    p.add_argument("--devices", required=True, help="comma-separated device ids, e.g. cpu:0,cpu:1 or cuda:0")
    p.add_argument("--mem-gib", type=float, default=None, help="memory per device to register (default: detected)")
    p.add_argument("--key", default=None,
                   help="executor key: an executor pool's (POST /v1/executor-pools, 'slicesched keys create-pool') "
                        "or the service's $SLICESCHED_EXECUTOR_KEY (default: $SLICESCHED_EXECUTOR_KEY)")
    p.add_argument("--executor-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--host-id", default=None, help="default: the hostname")
    p.add_argument("--max-batch", type=int, default=8, help="leases held at once (and KV slots per replica)")
    p.add_argument("--poll-wait-s", type=float, default=2.0, help="long-poll wait while idle")
    p.add_argument("--stage-host", default="127.0.0.1",
                   help="address of this node's stage server (layers placed here by leases held on other nodes)")
    p.add_argument("--stage-port", type=int, default=0, help="its port (0: any free port; -1: no stage server)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: one executor per core; more threads contend on small models)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``slicesched executor``: run the daemon until SIGTERM/SIGINT. Exit 2 on bad arguments
    or when the service refuses the registration."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat and poll
    key = args.key or os.environ.get("SLICESCHED_EXECUTOR_KEY")
    if not key:
        print("error: no key: pass --key or set SLICESCHED_EXECUTOR_KEY (an executor pool's key; "
              "'slicesched keys create-pool POOL' makes one)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.max_batch < 1 or args.poll_wait_s < 0 or args.threads < 1:
        print("error: --max-batch and --threads must be >= 1 and --poll-wait-s >= 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    torch.set_num_threads(args.threads)
    try:
        devices = describe_devices([d.strip() for d in args.devices.split(",") if d.strip()], args.mem_gib)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not devices:
        print("error: --devices names no device", file=sys.stderr)
        return EXIT_BAD_INPUT
    host = socket.gethostname()
    settings = Settings(server=args.server, key=key, executor_id=args.executor_id or f"{host}-{os.getpid()}",
                        host_id=args.host_id or host, devices=tuple(devices), max_batch=args.max_batch,
                        poll_wait_s=args.poll_wait_s)
    stage_server = None
    if args.stage_port >= 0:
        from executor.remote import StageServer

        stage_server = StageServer(args.stage_host, args.stage_port).start()
        settings = replace(settings, stage_url=stage_server.url)
    daemon = ExecutorDaemon(settings)
    daemon.install_signal_handlers()
    try:
        return daemon.run()
    except RegisterRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if stage_server is not None:
            stage_server.close()
