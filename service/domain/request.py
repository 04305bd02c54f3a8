"""Inference requests as a workload sees them, and a workload: requests ordered by arrival.

Pure data with validation; no I/O. Times are seconds from the start of the trace (t=0), token
counts are tokens of the model's tokenizer. ``output_tokens`` is the true output length, which
only an oracle policy may read: the scheduler estimates a token budget instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from service.domain.error import InvalidInputError


class RequestStatus(StrEnum):
    """A live request's status. The value is the string the API answers and the GMG stores."""

    QUEUED = "queued"  # waiting for a lease
    LEASED = "leased"  # an executor holds it
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"  # out of attempts

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


#: The statuses a request never leaves.
TERMINAL_STATUSES = frozenset({RequestStatus.DONE, RequestStatus.CANCELLED, RequestStatus.FAILED})


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request. Invariants: ``arrival_s >= 0`` and finite; both lengths ``>= 1`` token.

    ``prefix_hashes`` are the prefix-block hash ids of the prompt (Mooncake traces: one id per
    512-token block; equal ids are reusable KV blocks); ``()`` means unknown or no sharing.
    """

    request_id: str
    tenant_id: str
    model: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    sla_class: str = "standard"
    prefix_hashes: tuple[int, ...] = ()
    priority: int | None = None  # its own queue priority (higher first); None: its tenant's

    def __post_init__(self) -> None:
        # `not (x >= 0)` also rejects NaN
        if not (self.arrival_s >= 0.0) or math.isinf(self.arrival_s):
            raise InvalidInputError(f"request {self.request_id}: arrival_s must be finite and >= 0, "
                                    f"got {self.arrival_s}", culprit=self.request_id)
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise InvalidInputError(f"request {self.request_id}: prompt_tokens and output_tokens must be >= 1, "
                                    f"got {self.prompt_tokens} and {self.output_tokens}", culprit=self.request_id)


@dataclass(frozen=True, slots=True)
class Workload:
    """A named list of requests sorted by ``arrival_s`` (ties keep their given order).

    ``horizon_s`` is the length of the window the workload was drawn from, starting at t=0
    (a generator's ``duration_s``); ``None`` means "up to the last arrival". The list is owned
    by the workload: callers must not mutate it.
    """

    name: str
    requests: list[RequestSpec]
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        reqs = self.requests
        for i in range(1, len(reqs)):
            if reqs[i].arrival_s < reqs[i - 1].arrival_s:
                raise InvalidInputError(f"workload {self.name}: requests not sorted by arrival at index {i} "
                                        f"({reqs[i - 1].arrival_s} > {reqs[i].arrival_s})",
                                        culprit=reqs[i].request_id)
        if self.horizon_s is not None and not (self.horizon_s >= 0.0):
            raise InvalidInputError(f"workload {self.name}: horizon_s must be >= 0, got {self.horizon_s}")

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """Seconds from t=0 to the end of the workload: ``horizon_s`` if set, else the last arrival."""
        if self.horizon_s is not None:
            return self.horizon_s
        return self.requests[-1].arrival_s if self.requests else 0.0

    @property
    def offered_tokens_per_s(self) -> float:
        """Prompt plus output tokens of all requests per second of ``duration_s`` (0 if it is 0)."""
        duration_s = self.duration_s
        if duration_s <= 0.0:
            return 0.0
        return sum(r.prompt_tokens + r.output_tokens for r in self.requests) / duration_s

    def tenants(self) -> list[str]:
        """Distinct tenant ids, sorted."""
        return sorted({r.tenant_id for r in self.requests})

    def scaled(self, rate_factor: float) -> Workload:
        """The same requests at ``rate_factor`` times the arrival rate: every ``arrival_s`` (and
        ``horizon_s``) is divided by ``rate_factor``, so 2.0 doubles the offered load."""
        if not (rate_factor > 0.0) or math.isinf(rate_factor):
            raise InvalidInputError(f"rate_factor must be finite and > 0, got {rate_factor}")
        horizon_s = None if self.horizon_s is None else self.horizon_s / rate_factor
        return Workload(f"{self.name}@x{rate_factor:g}",
                        [replace(r, arrival_s=r.arrival_s / rate_factor) for r in self.requests],
                        horizon_s)

    def head(self, n: int) -> Workload:
        """The first ``n`` requests. If any are dropped the horizon becomes "up to the last kept arrival"."""
        if n < 0:
            raise InvalidInputError(f"head: n must be >= 0, got {n}")
        if n >= len(self.requests):
            return self
        return Workload(self.name, self.requests[:n])
