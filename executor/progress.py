"""Token reports of streaming leases, sent off the torch loop.

The main thread hands each round's new tokens to :class:`ProgressSender` (:meth:`offer`: a merge
under a lock, never a wait on the network); the sender's thread posts all that is pending in one
``POST /v1/leases/progress``. While a call is in flight, and for ``interval_s`` after it, the
next rounds' tokens accumulate and go together in the next call: at most one call per
``interval_s`` however many leases stream. The answer's ``cancel`` list (leases whose requests
ended, e.g. a streaming client that went away) reaches the main thread as the heartbeat's does.
A call that may pass (network, 5xx) keeps its tokens for the next one; a 404 means the service
does not know this executor (it registers again); another 4xx drops them (the completion still
carries every token).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from executor.settings import Backoff
from service.domain.error import ApiError, TransientError
from service.domain.wire import ProgressUpdate

log = logging.getLogger("slicesched.executor")

PATH = "/v1/leases/progress"

#: ``call(client, body)``: the answer's JSON; raises TransientError or ApiError.
Call = Callable[[httpx.Client, dict[str, Any]], dict[str, Any]]


class ProgressSender:
    """``start`` runs the sender thread, ``offer`` queues updates (any thread), ``close`` stops
    it (what is pending is dropped: the completions carry every token)."""

    def __init__(self, executor_id: str, client: Callable[[], httpx.Client], call: Call, *,
                 on_cancel: Callable[[list[str]], None], on_unknown: Callable[[], None],
                 interval_s: float = 0.01, backoff: Backoff) -> None:
        self.executor_id = executor_id
        self._client = client
        self._call = call
        self._on_cancel = on_cancel
        self._on_unknown = on_unknown
        self.interval_s = interval_s
        self._backoff = backoff
        self._cv = threading.Condition()
        self._pending: dict[str, tuple[int, list[int]]] = {}  # lease id -> (offset, tokens from it)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self.calls = 0  # posts made (tests, logs)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()

    def offer(self, updates: Iterable[ProgressUpdate]) -> None:
        with self._cv:
            for u in updates:
                self._merge(u.lease_id, u.offset, list(u.tokens))
            self._cv.notify()

    def _merge(self, lease_id: str, offset: int, tokens: list[int]) -> None:
        """Add tokens at ``offset`` after what is pending for the lease (updates of one lease come in order)."""
        held = self._pending.get(lease_id)
        if held is None:
            self._pending[lease_id] = (offset, tokens)
        else:
            held[1].extend(tokens[max(0, held[0] + len(held[1]) - offset):])

    def _take(self) -> dict[str, tuple[int, list[int]]] | None:
        """Wait for pending updates; None once closed."""
        with self._cv:
            while not self._pending and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            taken, self._pending = self._pending, {}
            return taken

    def _pause(self, seconds: float) -> None:
        with self._cv:
            if not self._closed:
                self._cv.wait_for(lambda: self._closed, seconds)

    def _run(self) -> None:
        with self._client() as client:
            while (taken := self._take()) is not None:
                body = {"executor_id": self.executor_id,
                        "updates": [ProgressUpdate(lid, offset, tuple(tokens)).to_json()
                                    for lid, (offset, tokens) in taken.items()]}
                try:
                    answer = self._call(client, body)
                except TransientError as exc:
                    with self._cv:  # keep them, ahead of what came meanwhile
                        later, self._pending = self._pending, taken
                        for lid, (offset, tokens) in later.items():
                            self._merge(lid, offset, tokens)
                    delay = self._backoff.failed()
                    log.warning("progress: %s; retrying in %.1f s", exc, delay)
                    self._pause(delay)
                    continue
                except ApiError as exc:
                    log.warning("progress refused: %s", exc)
                    if exc.status == 404:
                        self._on_unknown()
                else:
                    self._backoff.succeeded()
                    cancel = [str(x) for x in answer.get("cancel", [])]
                    if cancel:
                        self._on_cancel(cancel)
                self.calls += 1
                self._pause(self.interval_s)
