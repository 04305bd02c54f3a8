"""Simulator limits: the one home of the memory margin and KV watermark the simulated cluster
applies (batching limits are in :mod:`service.core.batching`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.domain.error import InvalidInputError

__all__ = ["SimConfig"]


@dataclass(frozen=True, slots=True)
class SimConfig:
    margin_fraction: float = 0.05  # of each device's memory kept free of allocations (the ledger's limit)
    kv_watermark_fraction: float = 0.01  # of a device's memory an admission leaves free besides the margin

    def __post_init__(self) -> None:
        for name in ("margin_fraction", "kv_watermark_fraction"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0) or math.isnan(value):
                raise InvalidInputError(f"sim config: {name} must be in [0, 1), got {value}", culprit=name)
