"""Pooled homes: one replica per tenant when the cluster has fewer devices than the tenants.

:func:`service.core.placement.container_replicas` gives every tenant whole devices of its own, so
a cluster smaller than its tenants' tensor-parallel groups cannot hold them at all. Sparse mixes
(many small models, each idle most of the time) are where that wastes most: a device a tenant
owns sits idle between its bursts. :func:`pooled_replicas` packs the tenants' replicas onto
fewer devices instead; replicas that share a device take turns iteration by iteration (the
simulator's device sharing), as guest replicas do today. Each tenant gets its share of the
cluster's devices in replicas, as container allocation sizes it (offered work over the total,
rounded, at least one), none two on one device. The packing is greedy and deterministic:
replicas in order of their tensor-parallel degree, then their share of offered work (largest
first), each onto the group of devices of one host whose busiest device would carry the least
offered work afterwards, among the groups where the replica's weights plus its KV reserve still
fit every device of the group (``usable_fraction`` of its memory, the same rule as :func:`min_tp`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from service.core.placement import TenantDemand, min_tp
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError


def tenants_fit_apart(spec: ClusterSpec, demands: Sequence[TenantDemand], *, weight_bytes: Callable[[str], int],
                      reserve_bytes: Callable[[str], int]) -> bool:
    """Whether every tenant can have devices of its own (what container allocation needs)."""
    mem = min(d.mem_bytes for d in spec.devices)
    return sum(min_tp(weight_bytes(t.model), reserve_bytes(t.model), mem) for t in demands) <= len(spec.devices)


def pooled_replicas(spec: ClusterSpec, demands: Sequence[TenantDemand], *, weight_bytes: Callable[[str], int],
                    reserve_bytes: Callable[[str], int], usable_fraction: float = 0.9
                    ) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(tenant_id, model, device_ids)`` per replica, several tenants' replicas sharing a device
    where needed (see the module). Raises :class:`InvalidInputError` naming the first tenant whose
    replica fits no group of devices."""
    mem = min(d.mem_bytes for d in spec.devices)
    by_host: dict[str, list[str]] = {}
    for d in spec.devices:
        by_host.setdefault(d.host_id, []).append(d.device_id)
    capacity = {d.device_id: d.mem_bytes * usable_fraction for d in spec.devices}
    used = dict.fromkeys(capacity, 0.0)
    work = dict.fromkeys(capacity, 0.0)
    holds: dict[str, set[str]] = {d: set() for d in capacity}  # device -> tenants with a replica on it
    tp = {t.tenant_id: min_tp(weight_bytes(t.model), reserve_bytes(t.model), mem, usable_fraction) for t in demands}
    total = sum(t.device_s_per_s for t in demands) or 1.0
    # replicas per tenant: its share of the cluster's devices, rounded, in groups of its degree
    # (at least one; never more than could sit on distinct devices)
    count = {t.tenant_id: min(len(capacity) // tp[t.tenant_id],
                              max(1, round(len(capacity) * t.device_s_per_s / total / tp[t.tenant_id])))
             for t in demands}
    units = [(t, t.device_s_per_s / count[t.tenant_id]) for t in demands for _ in range(count[t.tenant_id])]
    out: list[tuple[str, str, tuple[str, ...]]] = []
    for t, work_share in sorted(units, key=lambda u: (-tp[u[0].tenant_id], -u[1], u[0].tenant_id)):
        n = tp[t.tenant_id]
        per_device = (weight_bytes(t.model) + reserve_bytes(t.model)) / n
        share = work_share / n
        best: tuple[tuple[float, float, str], tuple[str, ...]] | None = None
        for devices in by_host.values():
            fits = sorted((d for d in devices if used[d] + per_device <= capacity[d] and t.tenant_id not in holds[d]),
                          key=lambda d: (work[d], d))
            if len(fits) < n:
                continue
            group = tuple(fits[:n])
            key = (max(work[d] for d in group) + share, max(used[d] for d in group), group[0])
            if best is None or key < best[0]:
                best = (key, group)
        if best is None:
            raise InvalidInputError(
                f"no {n} device(s) of one host have {per_device / 2**30:.1f} GiB free for {t.tenant_id}'s {t.model} "
                f"(the cluster's {len(spec.devices)} devices are full)", culprit=t.tenant_id)
        for device_id in best[1]:
            used[device_id] += per_device
            work[device_id] += share
            holds[device_id].add(t.tenant_id)
        out.append((t.tenant_id, t.model, best[1]))
    return out
