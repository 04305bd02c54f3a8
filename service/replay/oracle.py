"""``oracle-elastic``: the ceiling for placements that share devices between tenants.

At every scheduling step it knows the arrivals of the next interval (an oracle) and re-sizes
the container allocation to them plus the work already queued, moving whole devices between
tenants instantly and for free (:func:`service.sim.elastic.reallocate`: no weight copies,
running requests re-prefill on their tenant's remaining replicas). No real system can do this;
slice's gain over container is reported as a share of this ceiling's gain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from service.core.placement import TenantDemand, container_replicas
from service.domain.request import RequestSpec, Workload
from service.models.family import MODEL_CONFIGS
from service.sim.cluster import SimulatedCluster
from service.sim.elastic import reallocate
from service.sim.iteration import BatchFeatures, IterationCostTable, kv_bytes_per_token, weight_bytes
from service.sim.replica import ReplicaSpec

ORACLE_ELASTIC = "oracle-elastic"


class OracleElastic:
    """Re-sizes the allocation every ``interval_s`` to the next interval's true work.
    ``chunk(tenant, model, tp)`` gives a replica's token budget as the home replicas'."""

    def __init__(self, workload: Workload, tenants: Sequence[tuple[str, str]], *, cluster: SimulatedCluster,
                 interval_s: float, kv_reserve_tokens: int, max_num_seqs: int,
                 chunk: Callable[[str, str, int], int]) -> None:
        self.cluster = cluster
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
        """Re-size for ``[now_s, now_s + interval_s)``; returns the replicas added."""
        lo, hi = np.searchsorted(self._arrivals, [now_s, now_s + self.interval_s])
        work = dict.fromkeys((t for t, _ in self.tenants), 0.0)
        for r in self._requests[lo:hi]:
            work[r.tenant_id] += self.work_s(r)
        for _, r in self.cluster.in_flight():
            work[r.tenant_id] += self.work_s(r)
        demands = [TenantDemand(t, m, work[t] / self.interval_s) for t, m in self.tenants]
        groups = container_replicas(
            self.cluster.spec, demands, weight_bytes=lambda m: weight_bytes(MODEL_CONFIGS[m]),
            reserve_bytes=lambda m: self.kv_reserve_tokens * kv_bytes_per_token(MODEL_CONFIGS[m]))
        wanted = [ReplicaSpec(f"{t}/o", m, ds, self.chunk(t, m, len(ds)), self.max_num_seqs, tenant_id=t)
                  for t, m, ds in groups]
        _, added = reallocate(self.cluster, wanted)
        self.moves += added
        return added
