"""``oracle-elastic``: the ceiling for placements that share devices between tenants.

At every scheduling step it knows the arrivals of the coming ``lookahead_s`` (an oracle; 30 s by
default, which moves devices less often than sizing to each 5 s interval's arrivals would) and
re-sizes the container allocation to them plus the work already queued, moving whole devices between
tenants instantly and for free (:func:`service.sim.elastic.reallocate`: no weight copies,
running requests re-prefill on their tenant's remaining replicas). No real system can do this;
slice's gain over container is reported as a share of this ceiling's gain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from service.core.placement import TenantDemand, container_replicas
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec, Workload
from service.sim.cluster import SimulatedCluster
from service.sim.elastic import reallocate
from service.sim.iteration import BatchFeatures, IterationCostTable, kv_bytes_per_token, weight_bytes
from service.sim.replica import ReplicaSpec

ORACLE_ELASTIC = "oracle-elastic"


class OracleElastic:
    """Re-sizes the allocation every ``interval_s`` to the true work of the next ``lookahead_s``.
    ``chunk(tenant, model, tp)`` gives a replica's token budget as the home replicas'."""

    def __init__(self, workload: Workload, tenants: Sequence[tuple[str, str]], *, cluster: SimulatedCluster,
                 interval_s: float, kv_reserve_tokens: int, max_num_seqs: int,
                 chunk: Callable[[str, str, int], int], lookahead_s: float = 30.0) -> None:
        self.cluster = cluster
        self.lookahead_s = lookahead_s  # the true arrivals it sizes for (at least one interval)
        self.interval_s = interval_s
        self.tenants = list(tenants)
        self.kv_reserve_tokens = kv_reserve_tokens
        self.max_num_seqs = max_num_seqs
        self.chunk = chunk
        device = cluster.spec.devices[0]
        # Work per request in device-seconds: prompt tokens at a 512-token prefill's per-token
        # cost, output tokens at the per-sequence cost of a 32-sequence decode batch.
        self._per_token: dict[str, tuple[float, float]] = {}
        for _, model in self.tenants:
            if model not in self._per_token:
                table = IterationCostTable(MODEL_CONFIGS[model], cluster.cost_model, device)
                self._per_token[model] = (table.exact_s(BatchFeatures.of([(512, 0)], [])) / 512,
                                          table.exact_s(BatchFeatures.of([], [1024] * 32)) / 32)
        reqs = sorted(workload.requests, key=lambda r: r.arrival_s)
        self._arrivals = np.array([r.arrival_s for r in reqs])
        self._requests = reqs
        self.moves = 0

    def work_s(self, r: RequestSpec) -> float:
        a, b = self._per_token[r.model]
        return a * r.prompt_tokens + b * r.output_tokens

    def step(self, now_s: float) -> int:
        """Re-size for ``[now_s, now_s + lookahead_s)``; returns the replicas added."""
        span = max(self.interval_s, self.lookahead_s)
        lo, hi = np.searchsorted(self._arrivals, [now_s, now_s + span])
        work = dict.fromkeys((t for t, _ in self.tenants), 0.0)
        for r in self._requests[lo:hi]:
            work[r.tenant_id] += self.work_s(r)
        for _, r in self.cluster.in_flight():
            work[r.tenant_id] += self.work_s(r)
        demands = [TenantDemand(t, m, work[t] / span) for t, m in self.tenants]
        groups = container_replicas(
            self.cluster.spec, demands, weight_bytes=lambda m: weight_bytes(MODEL_CONFIGS[m]),
            reserve_bytes=lambda m: self.kv_reserve_tokens * kv_bytes_per_token(MODEL_CONFIGS[m]))
        _, added = reallocate(self.cluster, self._sticky(groups))
        self.moves += added
        return added

    def _sticky(self, groups: Sequence[tuple[str, str, tuple[str, ...]]]) -> list[ReplicaSpec]:
        """The allocation's group count per tenant, keeping the replicas that already run (only
        the devices whose tenant changes move; new groups go to freed devices of one host)."""
        want: dict[str, int] = {}
        size: dict[str, tuple[str, int]] = {}
        for t, m, ds in groups:
            want[t] = want.get(t, 0) + 1
            size[t] = (m, len(ds))
        cluster = self.cluster
        kept: list[ReplicaSpec] = []
        for rid in sorted(cluster.replica_ids):
            spec = cluster.replica_spec(rid)
            t = spec.tenant_id or ""
            if want.get(t, 0) > 0:
                want[t] -= 1
                kept.append(spec)
        free: dict[str, list[str]] = {}
        used = {d for s in kept for d in s.device_ids}
        for d in cluster.spec.devices:
            if d.device_id not in used:
                free.setdefault(d.host_id, []).append(d.device_id)
        out = list(kept)
        for t in sorted(want, key=lambda t: -size[t][1]):  # big groups first, they fragment worst
            model, tp = size[t]
            for _ in range(want[t]):
                host = next((h for h, ds in free.items() if len(ds) >= tp), None)
                if host is None:
                    break
                devices = tuple(free[host][:tp])
                del free[host][:tp]
                out.append(ReplicaSpec(f"{t}/o", model, devices, self.chunk(t, model, tp), self.max_num_seqs,
                                       tenant_id=t))
        return out
