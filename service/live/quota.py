"""Quota enforcement at admission, and usage per tenant and project.

Admission (:meth:`QuotaBook.admit`) charges a request's prompt plus ``max_tokens`` to the token
buckets of its tenant and its project, all or nothing, and refuses it with a 429 whose
``Retry-After`` is when the same request would fit, if any bucket lacks the tokens or the
device-seconds of the last hour are spent. What a request did not generate is refunded when it
ends. Device-seconds are charged when a lease ends: the iterations its request took part in
(the executor's ``busy_s``; the lease's wall time when it ended without a report) times its
replica's devices; a request batched with others is charged each iteration whole, so the quota
bounds occupancy, conservatively. Over-quota work never reaches a queue, so it cannot slow a
tenant that stays within its quota; devices are shared among tenants by weight (their homes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from service.domain.error import QuotaExceededError
from service.domain.quota import Quota, TokenBucket, WindowMeter


@dataclass
class Usage:
    """What one tenant or project used: tokens admitted, refunded and refused, device-seconds."""

    tokens_admitted: int = 0
    tokens_refunded: int = 0
    refused: int = 0
    device_s: WindowMeter = field(default_factory=WindowMeter)
    bucket: TokenBucket | None = None
    rate: float | None = None  # the rate the bucket was built for (rebuilt when the quota changes)

    def public(self, quota: Quota, now: float) -> dict[str, Any]:
        bucket = self.bucket
        return {"quota": quota.to_dict(), "tokens_admitted": self.tokens_admitted,
                "tokens_used": self.tokens_admitted - self.tokens_refunded, "requests_refused": self.refused,
                "device_s_last_hour": round(self.device_s.used(now), 6), "device_s_total": round(self.device_s.total, 6),
                "tokens_available": None if bucket is None else round(bucket.level + 0.0, 3)}


class QuotaBook:
    """Usage by scope: ``(tenant, None)`` for a tenant, ``(tenant, project)`` for a project."""

    def __init__(self) -> None:
        self.usage: dict[tuple[str, str | None], Usage] = {}
        self.dirty: set[tuple[str, str | None]] = set()  # usage changed since the GMG last got it

    def of(self, tenant_id: str, project_id: str | None) -> Usage:
        return self.usage.setdefault((tenant_id, project_id), Usage())

    def _bucket(self, usage: Usage, quota: Quota, now: float) -> TokenBucket | None:
        if quota.tokens_per_s is None:
            usage.bucket, usage.rate = None, None
            return None
        if usage.bucket is None or usage.rate != quota.tokens_per_s:
            usage.bucket, usage.rate = TokenBucket(quota.tokens_per_s, quota.burst_s, now), quota.tokens_per_s
        return usage.bucket

    def admit(self, scopes: list[tuple[str, str | None, Quota]], tokens: int, now: float) -> None:
        """Charge ``tokens`` to every scope, or refuse (``QuotaExceededError``) and charge none."""
        waits: list[tuple[float, str]] = []
        for tenant_id, project_id, quota in scopes:
            usage = self.of(tenant_id, project_id)
            what = f"tenant {tenant_id!r}" if project_id is None else f"project {project_id!r} of {tenant_id!r}"
            bucket = self._bucket(usage, quota, now)
            if bucket is not None:
                wait = bucket.wait_s(tokens, now)
                if wait > 0:
                    waits.append((wait, f"{what}: {tokens} tokens (prompt + max_tokens) exceed its quota of "
                                        f"{quota.tokens_per_s:g} tokens/s"))
            if quota.device_s_per_hour is not None:
                wait = usage.device_s.wait_s(quota.device_s_per_hour, now)
                if wait > 0:
                    waits.append((wait, f"{what}: its {quota.device_s_per_hour:g} device-seconds of the last hour "
                                        "are spent"))
        if waits:
            for tenant_id, project_id, _ in scopes:
                self.of(tenant_id, project_id).refused += 1
                self.dirty.add((tenant_id, project_id))
            wait, why = max(waits)
            if math.isinf(wait):
                raise QuotaExceededError(f"{why}: never (more than its burst holds); ask for fewer tokens",
                                         retry_after_s=3600.0)
            raise QuotaExceededError(f"{why}; retry in {math.ceil(wait)} s", retry_after_s=wait)
        for tenant_id, project_id, quota in scopes:
            usage = self.of(tenant_id, project_id)
            bucket = self._bucket(usage, quota, now)
            if bucket is not None:
                bucket.take(tokens, now)
            usage.tokens_admitted += tokens
            self.dirty.add((tenant_id, project_id))

    def refund(self, tenant_id: str, project_id: str, tokens: int, now: float) -> None:
        for scope in ((tenant_id, None), (tenant_id, project_id)):
            usage = self.of(*scope)
            usage.tokens_refunded += tokens
            if usage.bucket is not None:
                usage.bucket.refund(tokens, now)
            self.dirty.add(scope)

    def charge_device_s(self, tenant_id: str, project_id: str, device_s: float, now: float) -> None:
        for scope in ((tenant_id, None), (tenant_id, project_id)):
            self.of(*scope).device_s.add(device_s, now)
            self.dirty.add(scope)
