"""The roofline cost model: the analytical baseline and every other model's fallback.

Per operator: ``max(flops / (peak * eff_compute[kind]), bytes / (bw * eff_memory[kind])) +
launch_overhead_s``; a slice is the sum of its operators. Quantiles are fixed multiples of the
median (``spread``); ``overhead_by_kind`` replaces the overhead for the kinds it names. Pure: no I/O, no state; every parameter can be overridden, and
:meth:`RooflineCostModel.calibrated` fits the per-kind efficiencies to measured timings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from service.core.cost import OP_KINDS, Latency, OpFeatures
from service.domain.cluster import DEVICE_KINDS, Device

# Fraction of datasheet peak a kind reaches (compute, memory); rough public folklore for
# fp16 GEMMs and bandwidth-bound kernels on datacenter GPUs.
DEFAULT_COMPUTE_EFFICIENCY: dict[str, float] = {
    "linear": 0.7, "matmul": 0.6, "attention": 0.5, "norm": 0.2, "softmax": 0.2, "activation": 0.2,
    "elementwise": 0.2, "embedding": 0.2, "memory": 0.2, "creation": 0.2,
}
DEFAULT_MEMORY_EFFICIENCY: dict[str, float] = {k: 0.7 for k in OP_KINDS}


def device_of_kind(kind: str, device_id: str | None = None) -> Device:
    """A :class:`Device` with the catalog numbers of ``kind`` (for evaluation and tests)."""
    k = DEVICE_KINDS[kind]
    return Device(device_id or f"{kind}/0", "host0", k.name, k.mem_bytes, k.peak_flops, k.mem_bw_bytes_per_s)


@dataclass(frozen=True)
class RooflineCostModel:
    """``launch_overhead_s`` is added once per operator; ``spread`` = (p90/p50, p99/p50)."""

    compute_efficiency: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COMPUTE_EFFICIENCY))
    memory_efficiency: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MEMORY_EFFICIENCY))
    launch_overhead_s: float = 5e-6
    spread: tuple[float, float] = (1.1, 1.3)
    overhead_by_kind: Mapping[str, float] = field(default_factory=dict)  # overrides launch_overhead_s
    name: str = "roofline"

    def work_seconds(self, op: OpFeatures, device: Device) -> float:
        """Seconds of one operator's work at the kind's efficiencies, without its launch overhead."""
        ce = self.compute_efficiency.get(op.kind, 0.2)
        me = self.memory_efficiency.get(op.kind, 0.7)
        return max(op.flops / (device.peak_flops * ce), op.bytes_moved / (device.mem_bw_bytes_per_s * me))

    def op_seconds(self, op: OpFeatures, device: Device) -> float:
        """Median seconds of one operator."""
        return self.work_seconds(op, device) + self.overhead_by_kind.get(op.kind, self.launch_overhead_s)

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        p50 = math.fsum(self.op_seconds(op, device) for op in ops)
        return Latency(p50, p50 * self.spread[0], p50 * self.spread[1])

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        """:meth:`predict` of ``prefix + block * repeats + suffix`` without unrolling the block."""
        return self.predict(prefix, device) + self.predict(block, device).scaled(repeats) + self.predict(suffix, device)

    def calibrated(self, samples: Iterable[tuple[OpFeatures, Device, float]]) -> RooflineCostModel:
        """A copy fitted to measured ``(op, device, seconds)`` samples.

        Per kind, ``seconds ~ scale * roofline + overhead``: the overhead is picked from a small
        grid of fractions of the kind's fastest measurement, the scale is the median ratio given
        that overhead, and the pair with the least mean absolute log error wins. The scale
        divides both efficiencies. Kinds without samples keep their defaults.
        """
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for op, device, seconds in samples:
            if seconds > 0:
                base = self.op_seconds(op, device) - self.launch_overhead_s
                by_kind.setdefault(op.kind, []).append((max(base, 1e-12), seconds))
        ce, me = dict(self.compute_efficiency), dict(self.memory_efficiency)
        overheads = dict(self.overhead_by_kind)
        for kind, pairs in by_kind.items():
            bases = np.asarray([b for b, _ in pairs])
            secs = np.asarray([x for _, x in pairs])
            best = (math.inf, 1.0, self.launch_overhead_s)
            for frac in (0.0, 0.25, 0.5, 0.75, 0.9):
                overhead = frac * float(secs.min())
                scale = float(np.median((secs - overhead) / bases))
                err = float(np.mean(np.abs(np.log((scale * bases + overhead) / secs))))
                if err < best[0]:
                    best = (err, scale, overhead)
            _, scale, overhead = best
            ce[kind] = ce.get(kind, 0.2) / scale
            me[kind] = me.get(kind, 0.7) / scale
            overheads[kind] = overhead
        return replace(self, compute_efficiency=ce, memory_efficiency=me, overhead_by_kind=overheads,
                       name=self.name + "-calibrated")
