"""How the executor daemon reaches the service: its settings and the backoff between retries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a type only: importing the batcher would load torch
    from executor.batcher import Clock


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


GUEST_WEIGHT = 0.5  # a guest replica's claim on the executor's time against an owner's 1 (executor.worker)


@dataclass(frozen=True)
class Settings:
    # base URL of the service; several, comma-separated, for serve processes under leader election
    # without one address in front of them: a call that cannot connect, or that a standby refuses
    # (503 not_leader), moves to the next (executor.daemon)
    server: str
    key: str  # executor (or admin) key
    executor_id: str
    host_id: str
    devices: tuple[dict[str, Any], ...]  # [{device_id, kind, mem_bytes}] as registered
    max_batch: int = 8
    guest_weight: float = GUEST_WEIGHT
    poll_wait_s: float = 2.0  # long-poll wait while idle
    busy_poll_s: float = 0.05  # while running, poll (without waiting) at most this often
    timeout_s: float = 10.0  # per call, on top of a long poll's wait
    retry_base_s: float = 0.5  # first delay after a transient failure (doubling up to 10 s)
    stage_url: str | None = None  # this node's stage server, for drivers on other nodes (executor.remote)
    progress_interval_s: float = 0.01  # streaming leases' tokens are posted at most this often (coalesced)

    @property
    def servers(self) -> tuple[str, ...]:
        """The service's base URLs, in the order they are tried."""
        return tuple(u.strip() for u in self.server.split(",") if u.strip())
