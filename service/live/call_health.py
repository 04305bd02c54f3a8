"""Whether the writes of the request path (submissions, completions, workflow steps: the durable
writes before an answer) are failing, for readiness: issue 41's hand probes saw every submission and
completion answered 503 for about 100 s while ``/readyz`` said ready, since Neo4j itself answered
the watcher's pings. The lease path failing is now a reason not to be ready."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class CallHealth:
    """Failing when the last ``streak`` calls all ended in a 503 past their bound while Neo4j
    answered its watcher (Neo4j down makes the service not ready on its own) and the latest of
    them within ``window_s``: one success, ``window_s`` without a failure, or the gate reopening
    after an outage ends it. ``clock``: monotonic seconds."""

    def __init__(self, streak: int = 3, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if streak < 1 or window_s <= 0:
            raise ValueError("streak must be >= 1 and window_s > 0")
        self.streak = streak
        self.window_s = window_s
        self.clock = clock
        self.failures = 0  # in a row
        self.last_failure_at: float | None = None
        self.last_error: str | None = None

    def succeeded(self) -> None:
        self.failures = 0

    def failed(self, why: str) -> None:
        self.failures += 1
        self.last_failure_at = self.clock()
        self.last_error = why[:300]

    def failing(self) -> bool:
        return (self.failures >= self.streak and self.last_failure_at is not None
                and self.clock() - self.last_failure_at < self.window_s)

    def report(self) -> dict[str, Any]:
        ago = None if self.last_failure_at is None else round(self.clock() - self.last_failure_at, 3)
        return {"failing": self.failing(), "failures_in_a_row": self.failures, "last_failure_s_ago": ago,
                "last_error": self.last_error}
