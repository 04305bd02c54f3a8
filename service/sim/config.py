"""Simulator limits: the one home of the memory margin and KV watermark the simulated cluster
applies (batching limits are in :mod:`service.core.batching`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.domain.error import InvalidInputError

__all__ = ["SimConfig"]


KV_MODES = ("paged", "reserve")
DEVICE_SHARING = ("turns", "executor")


@dataclass(frozen=True, slots=True)
class SimConfig:
    margin_fraction: float = 0.05  # of each device's memory kept free of allocations (the ledger's limit)
    kv_watermark_fraction: float = 0.01  # of a device's memory an admission leaves free besides the margin
    # KV management: "paged" (blocks allocated as tokens grow, admission by current blocks and
    # the watermark, preemption of the newest request by recompute when memory runs out, as
    # vLLM does) or "reserve" (a request's prompt plus whole output reserved at admission).
    kv: str = "paged"
    kv_block_tokens: int = 16  # tokens per KV block (paged): each sequence rounds up to a block
    # Owner priority for guest slices (service.sim.pipeline): between two owner iterations a
    # waiting guest slice runs if the owner's last iteration plus the slice's p90 is within this
    # fraction of the owner's tightest TPOT target.
    guest_slack_fraction: float = 0.8
    # How replicas sharing a device take turns (service.sim.sharing): "turns" (first come first
    # served, iteration by iteration) or "executor" (as an executor daemon: by weighted time, paced
    # by TPOT; for whole replicas on one device each, the live mirror).
    device_sharing: str = "turns"
    record_token_gaps: bool = False  # keep every inter-token gap (``SimulatedCluster.token_gaps``): for TBT percentiles

    def __post_init__(self) -> None:
        if self.kv not in KV_MODES:
            raise InvalidInputError(f"sim config: kv must be one of {', '.join(KV_MODES)}, got {self.kv!r}", culprit="kv")
        if self.device_sharing not in DEVICE_SHARING:
            raise InvalidInputError(f"sim config: device_sharing must be one of {', '.join(DEVICE_SHARING)}, "
                                    f"got {self.device_sharing!r}", culprit="device_sharing")
        if self.kv_block_tokens < 1:
            raise InvalidInputError(f"sim config: kv_block_tokens must be >= 1, got {self.kv_block_tokens}",
                                    culprit="kv_block_tokens")
        if not (0.0 <= self.guest_slack_fraction <= 1.0):
            raise InvalidInputError(f"sim config: guest_slack_fraction must be in [0, 1], got {self.guest_slack_fraction}",
                                    culprit="guest_slack_fraction")
        for name in ("margin_fraction", "kv_watermark_fraction"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0) or math.isnan(value):
                raise InvalidInputError(f"sim config: {name} must be in [0, 1), got {value}", culprit=name)
