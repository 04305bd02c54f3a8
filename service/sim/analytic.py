"""A tiny analytic cost model so the simulator runs and is tested without ``learned/``.

Roofline per operator: an operator takes the longer of its compute time at a fraction of peak
FLOP/s and its memory time at a fraction of peak bandwidth, plus a fixed launch overhead.
Operators run back to back, so a slice costs the sum. Deterministic: p50 = p90 = p99.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.core.cost import Latency, OpFeatures
from service.domain.cluster import Device


@dataclass(frozen=True, slots=True)
class RooflineLike:
    """``CostModel`` implementation; efficiencies are in (0, 1], ``op_overhead_s`` >= 0."""

    name: str = "roofline-like"
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    op_overhead_s: float = 2e-6

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        flops_per_s = device.peak_flops * self.flops_efficiency
        bytes_per_s = device.mem_bw_bytes_per_s * self.bandwidth_efficiency
        total = 0.0
        for op in ops:
            compute_s = op.flops / flops_per_s
            memory_s = op.bytes_moved / bytes_per_s
            total += (compute_s if compute_s > memory_s else memory_s) + self.op_overhead_s
        return Latency.exact(total)
