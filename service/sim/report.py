"""What a simulation reports, and the observer that collects it.

The simulated cluster calls the hooks of :class:`SimObserver`; it computes no metric itself.
:class:`MetricsCollector` turns the hook calls into a :class:`SimReport` (plain, field-commented
dataclasses: the scheduler and the replay read them).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol

from service.core.memory import MemoryViolation

# Upper edges (seconds) of the idle-window histogram buckets; the last bucket is open.
IDLE_BUCKET_EDGES_S: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
IDLE_BUCKET_LABELS: tuple[str, ...] = ("<1ms", "1-10ms", "10-100ms", "0.1-1s", "1-10s", ">=10s")
# Share of finished requests, by true output length, that count as "long" for starvation.
LONG_FRACTION = 0.1
# Gaps shorter than this are float noise between back-to-back work, not idle windows.
_IDLE_EPS_S = 1e-9


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One finished (or dropped) request. Times in simulated seconds."""

    request_id: str
    tenant_id: str
    model: str
    replica_id: str  # "" when it was dropped before reaching a replica
    sla_class: str
    arrival_s: float
    admitted_s: float  # KV admitted and prefill started (nan when dropped)
    first_token_s: float  # end of the iteration that finished its prefill (nan when dropped)
    finish_s: float  # end of the iteration that produced its last token (nan when dropped)
    num_output_tokens: int
    ttft_s: float  # first_token_s - arrival_s
    tbt_mean_s: float  # mean gap between consecutive tokens (0 with one output token)
    tbt_max_s: float  # worst gap between consecutive tokens
    e2e_s: float  # finish_s - arrival_s
    slack_s: float  # smallest SLA slack (negative: missed); -inf when dropped
    sla_met: bool
    dropped: bool = False  # could never fit on any replica of its model


@dataclass(frozen=True, slots=True)
class DeviceReport:
    device_id: str
    busy_s: float  # seconds with a slice (iteration or placed slice) running
    utilisation: float  # busy_s / makespan_s
    num_slices: int  # executed slices (one per replica iteration, plus placed slices)
    idle_histogram: dict[str, int]  # idle windows between slices, counted by length bucket
    peak_mem_bytes: int  # highest ledger usage seen


@dataclass(slots=True)
class SimReport:
    makespan_s: float  # time of the last handled event
    num_events: int
    requests: list[RequestOutcome]
    devices: dict[str, DeviceReport]
    violations: list[MemoryViolation]  # forced allocations above a device's limit
    sla_attainment: float  # fraction of finished requests that met their SLA (1.0 if none)
    sla_attainment_by_tenant: dict[str, float] = field(default_factory=dict)
    # Starvation: the worst queueing delay (admitted_s - arrival_s) among finished requests whose
    # true output length is in the top LONG_FRACTION (the longest ceil(10%), ties included);
    # 0.0 when nothing finished.
    max_wait_s_long: float = 0.0
    max_wait_s: float = 0.0  # worst queueing delay of any finished request (0.0 when none)
    kv: str = "paged"  # the KV management simulated (SimConfig.kv)
    preemptions: int = 0  # requests preempted for KV memory (paged), each recomputed
    recomputed_tokens: int = 0  # prefill tokens computed again because of preemptions


class SimObserver(Protocol):
    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        """A slice ran on ``device_id`` over [start_s, end_s); calls come in end order per device."""
        ...

    def request_finished(self, outcome: RequestOutcome) -> None: ...


class MetricsCollector:
    """Collects device busy time, idle windows and request outcomes from the hooks."""

    def __init__(self, device_ids: list[str]) -> None:
        self.outcomes: list[RequestOutcome] = []
        self._busy_s = dict.fromkeys(device_ids, 0.0)
        self._last_end_s = dict.fromkeys(device_ids, 0.0)
        self._num_slices = dict.fromkeys(device_ids, 0)
        self._idle = {d: [0] * len(IDLE_BUCKET_LABELS) for d in device_ids}

    def busy_s(self) -> dict[str, float]:
        """Busy seconds per device so far (for utilisation over a window)."""
        return dict(self._busy_s)

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        self._busy_s[device_id] += end_s - start_s
        self._num_slices[device_id] += 1
        gap = start_s - self._last_end_s[device_id]
        if gap > _IDLE_EPS_S:
            self._idle[device_id][bisect.bisect_right(IDLE_BUCKET_EDGES_S, gap)] += 1
        self._last_end_s[device_id] = end_s

    def request_finished(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)

    def idle_histogram(self, device_id: str, until_s: float) -> dict[str, int]:
        """Idle windows on ``device_id``, counting a trailing one up to ``until_s``."""
        counts = list(self._idle[device_id])
        tail = until_s - self._last_end_s[device_id]
        if tail > _IDLE_EPS_S:
            counts[bisect.bisect_right(IDLE_BUCKET_EDGES_S, tail)] += 1
        return dict(zip(IDLE_BUCKET_LABELS, counts, strict=True))

    def report(self, *, makespan_s: float, num_events: int, peak_mem_bytes: dict[str, int],
               violations: list[MemoryViolation]) -> SimReport:
        devices = {
            d: DeviceReport(d, busy, busy / makespan_s if makespan_s > 0 else 0.0, self._num_slices[d],
                            self.idle_histogram(d, makespan_s), peak_mem_bytes.get(d, 0))
            for d, busy in self._busy_s.items()
        }
        done = [o for o in self.outcomes if not o.dropped]
        met = sum(o.sla_met for o in done)
        by_tenant: dict[str, list[int]] = {}
        for o in done:
            counts = by_tenant.setdefault(o.tenant_id, [0, 0])
            counts[0] += o.sla_met
            counts[1] += 1
        return SimReport(
            makespan_s=makespan_s, num_events=num_events, requests=list(self.outcomes), devices=devices,
            violations=list(violations), sla_attainment=met / len(done) if done else 1.0,
            sla_attainment_by_tenant={t: m / n for t, (m, n) in sorted(by_tenant.items())},
            max_wait_s_long=max_wait_s_long(done), max_wait_s=max((o.admitted_s - o.arrival_s for o in done), default=0.0),
        )


def max_wait_s_long(outcomes: list[RequestOutcome], fraction: float = LONG_FRACTION) -> float:
    """Worst ``admitted_s - arrival_s`` among the ``ceil(fraction * n)`` finished requests with the
    longest outputs (every request tied with the shortest of them included); 0.0 if none."""
    done = [o for o in outcomes if not o.dropped]
    if not done:
        return 0.0
    lengths = sorted((o.num_output_tokens for o in done), reverse=True)
    threshold = lengths[max(1, math.ceil(fraction * len(done))) - 1]
    return max(o.admitted_s - o.arrival_s for o in done if o.num_output_tokens >= threshold)
