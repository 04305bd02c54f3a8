"""What one run of one policy measured (or the simulator predicted): the same figures both ways.

Pure. A run's figures come from its per-request outcomes, computed by one function for the live
service and the simulator alike, so a difference between them is the system's, not the
bookkeeping's: output tokens per second over the run (first arrival to last completion), and the
median and P99 of time to first token and of completion latency (arrival to last token; numpy's
linear-interpolation percentiles). The wait before a request's prefill starts (live: for a lease
and a KV slot on the executor) is kept beside them as a diagnostic: it splits a latency into
queueing and service.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from service.domain.error import InvalidInputError

#: The figures compared per policy, and whether larger is better.
METRICS: dict[str, bool] = {"tokens_per_s": True, "ttft_p50_s": False, "ttft_p99_s": False,
                            "e2e_p50_s": False, "e2e_p99_s": False}


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished request: seconds from the run's first arrival (live: the service's clock)."""

    index: int  # its position in the workload
    arrival_s: float
    ttft_s: float  # arrival to first token
    e2e_s: float  # arrival to last token
    output_tokens: int
    queued_s: float = math.nan  # arrival to the start of its prefill (nan: not known)


@dataclass(frozen=True, slots=True)
class RunMetrics:
    requests: int
    output_tokens: int
    makespan_s: float  # first arrival to last completion
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    queued_p50_s: float = math.nan  # the diagnostic: median wait before the prefill starts
    queued_p99_s: float = math.nan

    def value(self, metric: str) -> float:
        if metric not in METRICS:
            raise InvalidInputError(f"unknown testbench metric {metric!r} (known: {', '.join(METRICS)})")
        return float(getattr(self, metric))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_metrics(outcomes: Sequence[Outcome]) -> RunMetrics:
    """The run's figures (``InvalidInputError`` for a run with no finished request)."""
    if not outcomes:
        raise InvalidInputError("a testbench run finished no request")
    start = min(o.arrival_s for o in outcomes)
    end = max(o.arrival_s + o.e2e_s for o in outcomes)
    makespan = max(1e-9, end - start)
    tokens = sum(o.output_tokens for o in outcomes)
    ttft = np.array([o.ttft_s for o in outcomes])
    e2e = np.array([o.e2e_s for o in outcomes])
    queued = np.array([o.queued_s for o in outcomes])
    return RunMetrics(len(outcomes), tokens, makespan, tokens / makespan,
                      float(np.percentile(ttft, 50)), float(np.percentile(ttft, 99)),
                      float(np.percentile(e2e, 50)), float(np.percentile(e2e, 99)),
                      float(np.percentile(queued, 50)), float(np.percentile(queued, 99)))
