"""``oracle-elastic``: the ceiling that slice's gain over container is measured against.

Two parts, the second of which makes it a ceiling.

**The pooled oracle** (:class:`OracleElastic`, one simulated run): the cluster as one pool of
whole devices that move between tenants instantly and for free (no weight copy,
:func:`service.sim.elastic.reallocate`), knowing the true arrivals of the next ``lookahead_s``.
At every scheduling step it considers three allocations: keep the current one, container's own
(the homes the run started from), and the pool re-sized to the true next window's work plus the
work in flight. It simulates each on a fork of the whole cluster with the true arrivals of the
window and keeps the one with the fewest late requests, then the most output tokens, then the
fewest moves. No real system can do this; what it still pays for is the recompute of requests
running on a device that moves (:mod:`service.sim.elastic`: its KV stays behind), which it sees
in its forks and so accepts only where the move still pays.

**The ceiling** (:func:`ceiling_result`, one walk point): the headline compares placements by
two figures of a load walk on a fixed grid: the sustained load (the highest load whose SLA
violations are <= the target, interpolated between the bracketing grid points) and the tokens
per second at that load (interpolated the same way). A pooled run cannot dominate every
placement by construction: it moves whole devices at step boundaries, so it cannot interleave
two tenants' iterations on one device within a step as ``replica`` and ``slice`` do, and
batching is non-linear (two half-loaded tenants sharing a device batch better than either
alone). So the ceiling's point at each load is, figure by figure, the best of the pooled run
and every placement run at that load: the fewest SLA violations and the most tokens per second.

What holds by construction, for each placement ``p`` compared (``v``: violation rate at a grid
load, ``T``: the target):

- *Sustained load.* The ceiling's ``v`` is <= ``p``'s at every grid load ``p`` was run at. So the
  ceiling's walk does not stop before ``p``'s (the first load where ``v > T``); where both stop at
  the same grid point, the interpolated load ``l0 + (l1 - l0) (T - v0) / (v1 - v0)`` falls in
  both ``v0`` and ``v1`` (its derivatives are ``(T - v1) / (v1 - v0)**2 < 0`` and
  ``-(T - v0) / (v1 - v0)**2 <= 0``), so the ceiling's is at least ``p``'s; where the ceiling stops
  later, its load is at least the grid point where ``p`` stopped, above ``p``'s figure.
- *Tokens per second at that load.* The ceiling's tokens are >= ``p``'s at every grid load ``p``
  was run at. Within one bracket the ceiling's interpolation weight is the larger, which helps
  only if ``p``'s tokens do not fall from the bracket's lower to its upper load; past ``p``'s
  bracket the ceiling's tokens come from runs at higher loads. The remaining assumption: **tokens
  finished within the horizon do not fall as the offered load rises** (below the loads where
  the ceiling stops). It is checked, not assumed, where the figures are reported
  (``ceiling_holds`` in ``benchmarks/replay_headline.py``) and in the property test.

The ceiling is only as far above the placements as the pooled run makes it: where a placement
sets the ceiling's point at every load, the share of the ceiling's gain it reaches is 1 by
definition. So the walk records which run set each figure (``set_by``), and the pooled run's
own figures are reported beside the ceiling's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from service.core.placement import TenantDemand, container_replicas
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec, Workload
from service.replay.report import PolicyResult
from service.sim.cluster import SimulatedCluster
from service.sim.elastic import reallocate
from service.sim.iteration import BatchFeatures, IterationCostTable, kv_bytes_per_token, weight_bytes
from service.sim.replica import ReplicaSpec

ORACLE_ELASTIC = "oracle-elastic"

Allocation = list[ReplicaSpec]


class OracleElastic:
    """The pooled oracle: every ``interval_s``, the best of keeping the allocation, container's
    homes and the pool re-sized to the true work of the next ``lookahead_s`` (default: one
    interval), judged on forks that see that window's true arrivals. ``chunk(tenant, model, tp)``
    gives a replica's token budget as the home replicas'."""

    def __init__(self, workload: Workload, tenants: Sequence[tuple[str, str]], *, cluster: SimulatedCluster,
                 interval_s: float, kv_reserve_tokens: int, max_num_seqs: int,
                 chunk: Callable[[str, str, int], int], homes: Sequence[ReplicaSpec],
                 lookahead_s: float | None = None) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.lookahead_s = max(interval_s, lookahead_s or interval_s)  # the true arrivals it sees
        self.tenants = list(tenants)
        self.kv_reserve_tokens = kv_reserve_tokens
        self.max_num_seqs = max_num_seqs
        self.chunk = chunk
        self.homes = list(homes)
        device = cluster.spec.devices[0]
        # Work per request in device-seconds, for sizing the pool: prompt tokens at a 512-token
        # prefill's per-token cost, output tokens at the per-sequence cost of a 32-sequence decode.
        self._per_token: dict[str, tuple[float, float]] = {}
        for _, model in self.tenants:
            if model not in self._per_token:
                table = IterationCostTable(MODEL_CONFIGS[model], cluster.cost_model, device)
                self._per_token[model] = (table.exact_s(BatchFeatures.of([(512, 0)], [])) / 512,
                                          table.exact_s(BatchFeatures.of([], [1024] * 32)) / 32)
        reqs = sorted(workload.requests, key=lambda r: (r.arrival_s, r.request_id))
        self._arrivals = np.array([r.arrival_s for r in reqs])
        self._requests = reqs
        self.moves = 0  # replicas added by the moves it made
        self.choices: dict[str, int] = {"keep": 0, "container": 0, "pooled": 0}

    def work_s(self, r: RequestSpec) -> float:
        a, b = self._per_token[r.model]
        return a * r.prompt_tokens + b * r.output_tokens

    def step(self, now_s: float) -> int:
        """Choose and apply the allocation for ``(now_s, now_s + interval_s]``; the cluster has run
        to ``now_s`` (arrivals up to it handled). Returns the replicas added."""
        current = [self.cluster.replica_spec(r) for r in sorted(self.cluster.replica_ids)]
        options: list[tuple[str, Allocation]] = []
        seen: set[frozenset[tuple[str | None, str, tuple[str, ...]]]] = set()
        for label, alloc in (("keep", current), ("container", self.homes), ("pooled", self._pooled(now_s))):
            key = frozenset((s.tenant_id, s.model, s.device_ids) for s in alloc)
            if key not in seen:  # an option equal to an earlier one is the same run
                seen.add(key)
                options.append((label, alloc))
        label, best = options[0]
        if len(options) > 1:
            scores = [(self._score(alloc, now_s), i) for i, (_, alloc) in enumerate(options)]
            label, best = options[min(scores)[1]]
        self.choices[label] += 1
        _, added = reallocate(self.cluster, best)
        self.moves += added
        return added

    def _window(self, now_s: float) -> list[RequestSpec]:
        """The true arrivals after ``now_s`` up to the lookahead (those up to ``now_s`` are in)."""
        lo, hi = np.searchsorted(self._arrivals, [now_s, now_s + self.lookahead_s], side="right")
        return self._requests[lo:hi]

    def _score(self, alloc: Allocation, now_s: float) -> tuple[int, int, int]:
        """``(late requests, -output tokens, moves)`` of the next window with ``alloc`` applied
        now, on a fork of the whole cluster fed the window's true arrivals. Late: finished late
        or dropped, or in flight at the window's end past a deadline."""
        fork = self.cluster.fork([d.device_id for d in self.cluster.spec.devices])
        _, added = reallocate(fork, alloc)
        fork.submit(self._window(now_s))
        tokens = fork.tokens_out
        end = now_s + self.lookahead_s
        fork.run(until=end)
        late = sum(1 for o in fork.report().requests if o.dropped or not o.sla_met)
        late += len(fork.late_in_flight(end))
        return late, tokens - fork.tokens_out, added

    def _pooled(self, now_s: float) -> Allocation:
        """The pool sized to the true work of the next window plus the work in flight."""
        span = self.lookahead_s
        work = dict.fromkeys((t for t, _ in self.tenants), 0.0)
        for r in self._window(now_s):
            work[r.tenant_id] += self.work_s(r)
        for _, r in self.cluster.in_flight():
            work[r.tenant_id] += self.work_s(r)
        demands = [TenantDemand(t, m, work[t] / span) for t, m in self.tenants]
        groups = container_replicas(
            self.cluster.spec, demands, weight_bytes=lambda m: weight_bytes(MODEL_CONFIGS[m]),
            reserve_bytes=lambda m: self.kv_reserve_tokens * kv_bytes_per_token(MODEL_CONFIGS[m]))
        return self._sticky(groups)

    def _sticky(self, groups: Sequence[tuple[str, str, tuple[str, ...]]]) -> Allocation:
        """The allocation's group count per tenant, keeping the replicas that already run (only
        the devices whose tenant changes move; new groups go to freed devices of one host)."""
        want: dict[str, int] = {}
        size: dict[str, tuple[str, int]] = {}
        for t, m, ds in groups:
            want[t] = want.get(t, 0) + 1
            size[t] = (m, len(ds))
        cluster = self.cluster
        kept: Allocation = []
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


# ---- the ceiling: the best of the pooled run and the placements, per load -------------------
def ceiling_result(pooled: PolicyResult, placements: Sequence[PolicyResult]) -> tuple[PolicyResult, dict[str, str]]:
    """The ceiling's point at one load: ``pooled`` with its SLA violation rate the lowest and its
    token throughputs the highest of ``pooled`` and ``placements`` (runs at the same load and
    workload), and which run set each (``{"sla_violation_rate": policy, "token_throughput_tps":
    policy}``; ties go to the pooled run). Other fields are the pooled run's."""
    runs = [pooled, *placements]
    if any(r.load_scale != pooled.load_scale for r in runs):
        raise ValueError("a ceiling point compares runs at one load: got "
                         + ", ".join(f"{r.policy} x{r.load_scale:g}" for r in runs))
    low = min(runs, key=lambda r: r.sla_violation_rate)  # min keeps the first of equals: the pooled run
    high = max(runs, key=lambda r: r.token_throughput_tps)
    fast = max(runs, key=lambda r: r.horizon_tokens_per_s)
    point = replace(pooled, sla_violation_rate=low.sla_violation_rate,
                    token_throughput_tps=high.token_throughput_tps,
                    horizon_tokens_per_s=fast.horizon_tokens_per_s)
    return point, {"sla_violation_rate": low.policy, "token_throughput_tps": high.policy}
