"""A device kind's slice latency fitted on what its executors measured: a fixed cost per operator
plus effective compute and memory rates.

    t(slice) = ops x per_op_s + FLOPs x s_per_flop + bytes x s_per_byte

with the slice's FLOPs and bytes as the physical floor counts them
(:func:`service.core.cost.floor_work`). The three coefficients are fitted per device kind by
non-negative least squares on relative errors (each observation's row divided by its measured
time), so a 1 ms slice weighs as much as a 100 ms one; the spread (p90, p99) is the quantiles of
measured over fitted. This is the roofline with its efficiencies and per-operator overhead
learned from the device itself, the model of a device no profile covers: a CPU executor's
latency is mostly PyTorch's dispatch per operator, which no GPU profile teaches the GNN.
:func:`learned.observations.train_observed` offers it beside the refitted GNN and the table and
keeps, per device kind, the one that predicts the held-out observations best.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from learned.gnn import GraphSample
from service.core.cost import Latency, OpFeatures, floor_work
from service.domain.cluster import Device
from service.domain.error import InvalidInputError

#: The fewest observations a kind's rates are fitted on.
MIN_FIT_ROWS = 8


@dataclass(frozen=True, slots=True)
class KindRates:
    """One device kind's fitted coefficients (seconds per operator, per FLOP, per byte), the
    spread of measured over fitted (``p90_ratio``, ``p99_ratio`` >= 1) and the rows fitted on."""

    per_op_s: float
    s_per_flop: float
    s_per_byte: float
    p90_ratio: float
    p99_ratio: float
    n: int

    def seconds(self, n_ops: float, flops: float, moved: float) -> float:
        return n_ops * self.per_op_s + flops * self.s_per_flop + moved * self.s_per_byte


def _work(ops: Sequence[OpFeatures]) -> tuple[float, float, float]:
    moved, flops = floor_work(ops)
    return float(len(ops)), flops, moved


class RateCostModel:
    """:class:`KindRates` per device kind as a cost model; a kind it was not fitted on is an
    :class:`InvalidInputError` (the artifact routes only fitted kinds to it)."""

    name = "rates"

    def __init__(self, kinds: Mapping[str, KindRates]) -> None:
        self.kinds = dict(kinds)

    def _rates(self, device: Device) -> KindRates:
        rates = self.kinds.get(device.kind)
        if rates is None:
            raise InvalidInputError(f"no fitted rates for device kind {device.kind!r} (fitted: {sorted(self.kinds)})")
        return rates

    def _latency(self, rates: KindRates, seconds: float) -> Latency:
        return Latency(seconds, seconds * rates.p90_ratio, seconds * rates.p99_ratio)

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        rates = self._rates(device)
        return self._latency(rates, rates.seconds(*_work(ops)))

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        """Linear in the operators: the block's time ``repeats`` times, without unrolling it."""
        rates = self._rates(device)
        seconds = rates.seconds(*_work(prefix)) + repeats * rates.seconds(*_work(block)) + rates.seconds(*_work(suffix))
        return self._latency(rates, seconds)

    def to_doc(self) -> dict[str, Any]:
        return {kind: asdict(r) for kind, r in sorted(self.kinds.items())}

    @staticmethod
    def from_doc(doc: Mapping[str, Mapping[str, Any]]) -> RateCostModel:
        return RateCostModel({kind: KindRates(**r) for kind, r in doc.items()})


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0, for a few columns: every subset of columns solved by least
    squares, the best one whose solution is non-negative."""
    best, best_loss = np.zeros(a.shape[1]), float(np.sum(b * b))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x < 0):
                continue
            loss = float(np.sum((a[:, cols] @ x - b) ** 2))
            if loss < best_loss:
                best_loss = loss
                best = np.zeros(a.shape[1])
                best[list(cols)] = x
    return best


def fit_rates(samples: Sequence[GraphSample]) -> KindRates | None:
    """The coefficients fitted on ``samples`` (one device kind's; ``target_ms`` measured), or
    None with fewer than :data:`MIN_FIT_ROWS` of them or nothing to fit."""
    usable = [s for s in samples if s.target_ms > 0 and math.isfinite(s.target_ms)]
    if len(usable) < MIN_FIT_ROWS:
        return None
    work = np.asarray([_work(s.ops) for s in usable], dtype=np.float64)
    measured = np.asarray([s.target_ms / 1e3 for s in usable])
    scale = work.max(axis=0)
    scale[scale <= 0] = 1.0
    coef = _nnls(work / scale / measured[:, None], np.ones(len(usable))) / scale  # relative errors
    if not np.any(coef > 0):
        return None
    fitted = work @ coef
    ratio = measured / fitted
    return KindRates(float(coef[0]), float(coef[1]), float(coef[2]),
                     max(1.0, float(np.quantile(ratio, 0.9))), max(1.0, float(np.quantile(ratio, 0.99))), len(usable))
