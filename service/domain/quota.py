"""Quotas and the meters that enforce them (pure: time is passed in, never read).

A :class:`Quota` bounds a tenant or a project: tokens per second (a token bucket that holds
``burst_s`` seconds of the rate, so a short burst passes and a sustained excess does not),
device-seconds over a sliding hour, and the bytes of weights its models may hold. ``None`` is no
limit. Admission charges a request its prompt plus its ``max_tokens`` up front; what it did not
generate is given back when it ends (:meth:`TokenBucket.refund`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

DEVICE_WINDOW_S = 3600.0  # device-seconds are counted over the last hour
DEFAULT_BURST_S = 10.0


@dataclass(frozen=True)
class Quota:
    tokens_per_s: float | None = None
    device_s_per_hour: float | None = None
    mem_bytes: int | None = None
    burst_s: float = DEFAULT_BURST_S

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_per_s": self.tokens_per_s, "device_s_per_hour": self.device_s_per_hour,
                "mem_bytes": self.mem_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Quota:
        d = d or {}
        return cls(_num(d.get("tokens_per_s")), _num(d.get("device_s_per_hour")),
                   None if d.get("mem_bytes") is None else int(d["mem_bytes"]))

    def raised_by(self, other: Quota) -> Quota:
        """This quota with every limit ``other`` sets replacing ours (an approved increase)."""
        return Quota(other.tokens_per_s if other.tokens_per_s is not None else self.tokens_per_s,
                     other.device_s_per_hour if other.device_s_per_hour is not None else self.device_s_per_hour,
                     other.mem_bytes if other.mem_bytes is not None else self.mem_bytes, self.burst_s)


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


class TokenBucket:
    """``rate`` tokens a second, holding at most ``rate * burst_s``; starts full."""

    def __init__(self, rate: float, burst_s: float, now_s: float) -> None:
        self.rate = rate
        self.capacity = max(rate * burst_s, 1.0)
        self.level = self.capacity
        self.at_s = now_s

    def _fill(self, now_s: float) -> None:
        if now_s > self.at_s:
            self.level = min(self.capacity, self.level + (now_s - self.at_s) * self.rate)
            self.at_s = now_s

    def wait_s(self, tokens: float, now_s: float) -> float:
        """Seconds until ``tokens`` could be taken (0: now; ``inf``: never, more than it holds)."""
        self._fill(now_s)
        if tokens > self.capacity:
            return math.inf
        return max(0.0, (tokens - self.level) / self.rate)

    def take(self, tokens: float, now_s: float) -> None:
        self._fill(now_s)
        self.level -= tokens

    def refund(self, tokens: float, now_s: float) -> None:
        self._fill(now_s)
        self.level = min(self.capacity, self.level + tokens)


class WindowMeter:
    """Amounts recorded at times, summed over the last ``window_s``."""

    def __init__(self, window_s: float = DEVICE_WINDOW_S) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self.total = 0.0  # everything ever recorded

    def _expire(self, now_s: float) -> None:
        while self._events and self._events[0][0] <= now_s - self.window_s:
            self._sum -= self._events.popleft()[1]

    def add(self, amount: float, now_s: float) -> None:
        self._events.append((now_s, amount))
        self._sum += amount
        self.total += amount

    def used(self, now_s: float) -> float:
        self._expire(now_s)
        return max(0.0, self._sum)

    def wait_s(self, limit: float, now_s: float) -> float:
        """Seconds until the use in the window drops below ``limit`` (0: it is below now)."""
        used = self.used(now_s)
        if used < limit:
            return 0.0
        for at, amount in self._events:
            used -= amount
            if used < limit:
                return at + self.window_s - now_s
        return self.window_s
