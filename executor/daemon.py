"""The executor daemon's protocol loop (the command is :mod:`executor.command`).

It registers its devices with the service, long-polls leases, runs each lease's request in
the :class:`~executor.worker.Worker` (the torch side) and posts a completion when the request
finishes (the protocol is in ``docs/API.md``, its shapes in :mod:`service.domain.wire`).

Threads
    The main thread owns the torch work and never waits on the network: it takes the leases
    the exchange thread received, runs the worker's rounds and hands finished results back. The
    exchange thread makes the lease calls: it polls for as many leases as there are free slots
    (a long poll while the worker is idle, at most every ``busy_poll_s`` while it runs) and posts
    completions and failures as soon as they are handed over. (These calls once ran between
    rounds on the main thread: measured on the live demo, a quarter of a busy executor's time
    went to waiting for poll answers, a service on a loaded machine answering in about 12 ms.)
    A heartbeat thread renews the held leases every ``heartbeat_s`` and passes the service's
    cancellations (and its drain flag) to the main thread; a progress thread
    (:mod:`executor.progress`) posts the new tokens of streaming leases after each round and
    passes on the cancellations it is answered.

A replica's batcher has ``max_batch`` KV slots (the service never leases a replica more); the
daemon holds at most ``2 * max_batch`` leases per device (it polls for the free slots only), so
a lease joins its batcher at the next iteration. Transient failures (network, 5xx)
are logged and retried with backoff; results that could not be posted wait for the next
attempt. A 4xx on registration is fatal (:class:`RegisterRefused`). SIGTERM or SIGINT stops
polling, finishes the held leases, posts their results, deregisters and exits 0; a second
signal abandons the leases (the service re-queues them when the executor leaves).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

import httpx

from executor.batcher import Clock
from executor.progress import PATH as PROGRESS_PATH
from executor.progress import ProgressSender
from executor.settings import Backoff, Settings
from executor.worker import Lease, Worker
from service.domain.error import ApiError, InvalidInputError, RegisterRefused, TransientError
from service.domain.wire import Completion, Failure, Heartbeat, Poll

log = logging.getLogger("slicesched.executor")

IDLE_PAUSE_S = 0.2  # how long an idle thread sleeps when nothing wakes it


class _Mailbox:
    """What the threads hand each other, under one lock: the leases the exchange thread received
    and the results the main thread finished (both ways between the torch and the network), the
    held leases and the service's cancellations (heartbeat), and flags as plain values (each
    write a single assignment)."""

    def __init__(self, free_slots: int) -> None:
        self._lock = threading.Lock()
        self._held: list[str] = []
        self._cancel: list[str] = []
        self._received: list[tuple[Any, float]] = []  # (raw lease, receipt time), not yet taken
        self._completions: list[tuple[Lease, Completion]] = []  # finished, not yet accepted by the service
        self._failures: list[Failure] = []
        self._free_slots = free_slots  # the worker's, as the main thread last published them
        self.service_drain = False
        self.needs_register = False
        self.busy = False  # the worker holds leases (published by the main thread)
        self.polling = False  # a poll is in flight (the exchange thread)
        self.busy_s = 0.0  # the worker's total iteration time, published by the main thread
        self.ready: tuple[str, ...] = ()  # the worker's built replicas, published by the main thread

    # the main thread's side
    def publish(self, held: list[str], free_slots: int, busy_s: float, ready: list[str]) -> None:
        with self._lock:
            self._held = list(held)
            self._free_slots = free_slots
            self.busy = bool(held)
            self.busy_s = busy_s
            self.ready = tuple(ready)

    def take_received(self) -> list[tuple[Any, float]]:
        """The received leases, whose slots count as taken until the next :meth:`publish`. Taking
        any makes the worker busy at once: between the take and the next publish, an exchange
        thread that saw the worker idle would start a long poll and hold the leases' completions
        behind it (up to ``poll_wait_s``: a lone request's result shown done two seconds late)."""
        with self._lock:
            taken, self._received = self._received, []
            self._free_slots = max(0, self._free_slots - len(taken))
            if taken:
                self.busy = True
            return taken

    def add_results(self, completions: list[tuple[Lease, Completion]], failures: list[Failure]) -> None:
        with self._lock:
            self._completions.extend(completions)
            self._failures.extend(failures)

    # the exchange thread's side
    def to_poll(self) -> int:
        """Free slots not already promised to received leases."""
        with self._lock:
            return max(0, self._free_slots - len(self._received))

    def receive(self, leases: list[Any], received_s: float) -> None:
        with self._lock:
            self._received.extend((raw, received_s) for raw in leases)

    def completions(self) -> list[tuple[Lease, Completion]]:
        with self._lock:
            return list(self._completions)

    def posted(self, lease_ids: set[str]) -> None:
        """Forget completions the service answered (accepted, rejected or refused)."""
        with self._lock:
            self._completions = [(lease, c) for lease, c in self._completions if lease.lease_id not in lease_ids]

    def first_failure(self) -> Failure | None:
        with self._lock:
            return self._failures[0] if self._failures else None

    def failure_posted(self) -> None:
        with self._lock:
            self._failures.pop(0)

    # anyone's
    def running(self) -> list[str]:
        """What the heartbeat renews: held leases, and finished ones whose completion the service
        has not yet accepted (a Neo4j outage can delay that)."""
        with self._lock:
            return self._held + [lease.lease_id for lease, _ in self._completions]

    def unsent(self) -> int:
        with self._lock:
            return len(self._completions) + len(self._failures)

    def has_received(self) -> bool:
        with self._lock:
            return bool(self._received)

    def occupied(self) -> bool:
        """The worker holds leases or has some waiting to be taken (one read under the lock: a
        take between two separate reads would look like neither)."""
        with self._lock:
            return self.busy or bool(self._received)

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
                             clock=clock, guest_weight=settings.guest_weight)
        self._transport = transport
        self.lease_ttl_s = 30.0
        self.heartbeat_s = 5.0
        self._mailbox = _Mailbox(self.worker.free_slots)
        self._stop = threading.Event()  # drain: no more polling
        self._abort = threading.Event()  # leave now
        self._wake = threading.Event()  # interrupts the main thread's pauses
        self._net_wake = threading.Event()  # interrupts the exchange thread's pauses (results to post, a stop)
        self._finished = threading.Event()  # ends the heartbeat and exchange threads
        self._refused: RegisterRefused | None = None  # a registration again refused (exchange thread): fatal
        self._poll_backoff = Backoff(clock, base_s=settings.retry_base_s)
        self._post_backoff = Backoff(clock, base_s=settings.retry_base_s)
        self._register_backoff = Backoff(clock, base_s=settings.retry_base_s)
        self._last_poll_s = -float("inf")
        self._last_contact_s = clock()
        self._progress = ProgressSender(
            settings.executor_id, self._client, lambda client, body: self._call(client, "POST", PROGRESS_PATH, body),
            on_cancel=self._cancelled, on_unknown=self._unknown, interval_s=settings.progress_interval_s,
            backoff=Backoff(clock, base_s=settings.retry_base_s))

    # ---- lifecycle ------------------------------------------------------------------------------
    def run(self) -> int:
        with self._client() as client:
            if not self._register_until_done(client):
                return 0  # stopped before it could register: it holds nothing
            heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
            heartbeat.start()
            self._progress.start()
            exchange = threading.Thread(target=self._exchange_loop, name="exchange", daemon=True)
            exchange.start()
            try:
                self._loop()
                if self._refused is not None:
                    raise self._refused
            finally:
                self._finished.set()
                self._net_wake.set()
                exchange.join(self.settings.poll_wait_s + self.settings.timeout_s)  # a long poll may be in flight
                self._progress.close()
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
        self._net_wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT call :meth:`request_stop` (call from the main thread)."""
        def handler(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _client(self) -> httpx.Client:
        s = self.settings
        return httpx.Client(base_url=s.servers[0], headers={"Authorization": f"Bearer {s.key}"},
                            timeout=s.timeout_s, transport=self._transport)

    def _fail_over(self, client: httpx.Client, why: str) -> None:
        """Point ``client`` at the next of several service addresses (a standby's, which may lead now)."""
        servers = self.settings.servers
        if len(servers) < 2:
            return
        here = str(client.base_url).rstrip("/")
        at = next((i for i, u in enumerate(servers) if u.rstrip("/") == here), -1)
        client.base_url = httpx.URL(servers[(at + 1) % len(servers)])
        log.info("%s: trying the service at %s", why, client.base_url)

    def _call(self, client: httpx.Client, method: str, path: str, body: Any = None,
              timeout_s: float | None = None) -> dict[str, Any]:
        """One API call: the JSON answer, :class:`ApiError` on a 4xx, :class:`TransientError`
        on anything that may pass."""
        try:
            response = client.request(method, path, json=body, timeout=timeout_s or self.settings.timeout_s)
        except httpx.TransportError as exc:
            self._fail_over(client, f"{type(exc).__name__}")
            raise TransientError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            message = _error_message(response)
            if response.status_code == 503 and message.startswith("not_leader:"):
                self._fail_over(client, "not the leader")
            raise TransientError(f"{method} {path}: {response.status_code} {message}")
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

    # ---- the main thread: the torch work ---------------------------------------------------------
    def _loop(self) -> None:
        mailbox = self._mailbox
        was_busy = False
        while not self._abort.is_set():
            for lease_id in mailbox.take_cancel():
                if self.worker.cancel(lease_id):
                    log.info("lease %s cancelled by the service", lease_id)
            failures: list[Failure] = []
            for raw, received_s in mailbox.take_received():
                self._take(raw, received_s, failures)
            if self._stop.is_set() and not self.worker.busy and self._drained_or_unreachable():
                return
            result = self.worker.step_round()
            updates = self.worker.progress()
            if updates:
                self._progress.offer(updates)
            failures += result.failed
            if result.completed or failures:
                mailbox.add_results(result.completed, failures)
            # Results before the busy flag: an exchange thread that sees the worker idle has them.
            mailbox.publish(self.worker.lease_ids, self.worker.free_slots, self.worker.busy_s, self.worker.ready)
            if result.completed or failures or (was_busy and not self.worker.busy):
                self._net_wake.set()  # results to post, or an idle worker to long-poll for
            was_busy = self.worker.busy
            if not self.worker.busy:
                self._pause(IDLE_PAUSE_S)

    def _take(self, raw: Any, received_s: float, failures: list[Failure]) -> None:
        """Submit one polled lease to the worker; a lease that cannot run here is failed."""
        try:
            lease = Lease.from_json(raw, received_s)
        except (KeyError, TypeError, ValueError, InvalidInputError) as exc:
            lease_id = raw.get("lease_id") if isinstance(raw, dict) else None
            log.error("malformed lease %s: %r", lease_id, exc)
            if lease_id is not None:
                failures.append(Failure(str(lease_id), f"malformed lease: {exc!r}"))
            return
        try:
            if not self.worker.accept(lease):
                log.warning("lease %s received twice: ignored", lease.lease_id)
        except Exception as exc:  # unknown family, bad stages, too long, out of memory building it
            log.error("lease %s (request %s) cannot run here: %s", lease.lease_id, lease.request_id, exc)
            failures.append(Failure(lease.lease_id, str(exc)))

    def _cancelled(self, lease_ids: list[str]) -> None:
        """Leases the service cancelled (from the progress thread): the main loop drops them next."""
        self._mailbox.post_cancel(lease_ids)
        self._wake.set()

    def _unknown(self) -> None:
        self._mailbox.needs_register = True
        self._net_wake.set()

    def _drained_or_unreachable(self) -> bool:
        """While stopping with nothing running: True when every result is posted and no poll can
        still bring a lease, or when the service has not answered for a lease ttl (the leases
        have expired: results are moot)."""
        mailbox = self._mailbox
        unsent = mailbox.unsent()
        if not unsent:
            return not (mailbox.polling or mailbox.has_received())
        if self.clock() - self._last_contact_s > self.lease_ttl_s:
            log.error("giving up %d unposted result(s): no answer from the service for %.0f s",
                      unsent, self.clock() - self._last_contact_s)
            return True
        return False

    def _pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a stop request or a received lease ends it early."""
        self._wake.wait(seconds)
        self._wake.clear()

    # ---- the exchange thread: lease calls -----------------------------------------------------
    def _exchange_loop(self) -> None:
        """Post results as soon as they are handed over, poll for the free slots; until the main
        thread has finished. A failure here is logged and retried, never fatal to the thread."""
        with self._client() as client:
            while not self._finished.is_set() and not self._abort.is_set():
                try:
                    if self._mailbox.needs_register and self._register_backoff.ready() \
                            and not self._register_once(client):
                        self._register_backoff.failed()
                    self._post_results(client)
                    polled = self._poll(client)
                except RegisterRefused as exc:  # the service no longer takes this executor: leave
                    self._refused = exc
                    self._abort.set()
                    self._wake.set()
                    return
                except Exception:  # a bug: keep the executor alive, the lease ttl guards the work
                    log.exception("the exchange thread failed a round; going on")
                    polled = False
                    self._pause_exchange(self.settings.retry_base_s)
                if not polled:
                    self._pause_exchange(self._until_next_poll())

    def _until_next_poll(self) -> float:
        """How long the exchange thread sleeps when it did not poll (a result or an idle worker
        wakes it sooner): while the worker runs, until the next poll is due (every ``busy_poll_s``
        from the last, not ``busy_poll_s`` from whenever a completion woke it), or a whole
        ``busy_poll_s`` when one is due but there is nothing to poll for (no free slot); idle,
        :data:`IDLE_PAUSE_S`."""
        if not self._mailbox.busy:
            return IDLE_PAUSE_S
        due = self._last_poll_s + self.settings.busy_poll_s - self.clock()
        return due if due > 1e-3 else self.settings.busy_poll_s

    def _pause_exchange(self, seconds: float) -> None:
        self._net_wake.wait(seconds)
        self._net_wake.clear()

    def _poll(self, client: httpx.Client) -> bool:
        """Poll for as many leases as there are free slots (waiting only while the worker is idle
        and has nothing to post) and hand them to the main thread. True when a poll was answered."""
        s, mailbox = self.settings, self._mailbox
        free = mailbox.to_poll()
        if self._stop.is_set() or mailbox.service_drain or mailbox.needs_register or free == 0:
            return False
        busy = mailbox.occupied()
        if not self._poll_backoff.ready() or (busy and self.clock() - self._last_poll_s < s.busy_poll_s):
            return False
        wait_s = 0.0 if busy or mailbox.unsent() else s.poll_wait_s
        body = Poll(s.executor_id, free, wait_s, mailbox.ready).to_json()
        self._last_poll_s = self.clock()
        mailbox.polling = True
        try:
            answer = self._call(client, "POST", "/v1/leases/poll", body, timeout_s=wait_s + s.timeout_s)
        except (TransientError, ApiError) as exc:
            self._on_call_error("poll", exc, self._poll_backoff)
            return False
        finally:
            mailbox.polling = False
        self._poll_backoff.succeeded()
        leases = answer.get("leases", [])
        if leases:
            mailbox.receive(list(leases), self.clock())
            self._wake.set()
        return True

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
        if not self._mailbox.unsent() or not self._post_backoff.ready():
            return
        try:
            completions = self._mailbox.completions()
            if completions:
                self._post_completions(client, completions)
            while (failure := self._mailbox.first_failure()) is not None:
                try:
                    self._call(client, "POST", f"/v1/leases/{failure.lease_id}/fail", failure.to_json())
                except ApiError as exc:
                    log.warning("fail of lease %s refused: %s", failure.lease_id, exc)
                self._mailbox.failure_posted()
        except TransientError as exc:
            self._on_call_error("post results", exc, self._post_backoff)
            return
        self._post_backoff.succeeded()

    def _post_completions(self, client: httpx.Client, completions: list[tuple[Lease, Completion]]) -> None:
        body = {"executor_id": self.settings.executor_id, "results": [c.to_json() for _, c in completions]}
        sent = {lease.lease_id for lease, _ in completions}
        try:
            answer = self._call(client, "POST", "/v1/leases/complete", body)
        except ApiError as exc:
            log.error("completions refused (%s): dropping %d", exc, len(completions))
            if exc.status == 404:
                self._mailbox.needs_register = True
            self._mailbox.posted(sent)
            return
        rejected = {r.get("lease_id"): r.get("reason") for r in answer.get("rejected", []) if isinstance(r, dict)}
        for lease, c in completions:
            if lease.lease_id in rejected:
                log.warning("lease %s (request %s) done but rejected: %s", lease.lease_id, lease.request_id,
                            rejected[lease.lease_id])
            else:
                log.info("lease %s (request %s on %s) done: %d tokens, ttft %.3f s, e2e %.3f s, %d iterations",
                         lease.lease_id, lease.request_id, lease.replica_id, len(c.output_tokens), c.ttft_s, c.e2e_s,
                         c.iterations)
        self._mailbox.posted(sent)

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
            answer = self._call(client, "POST", path, Heartbeat(tuple(self._mailbox.running()),
                                                                 self._mailbox.busy_s).to_json())
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
