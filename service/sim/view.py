"""The simulated cluster seen through the scheduler's :class:`~service.core.scheduler.ClusterView`.

Replica ids are ``"<tenant_id>/<n>"`` (home replicas) and ``"<tenant_id>/g<n>"`` (guests), so
timelines and reports can colour work by tenant. Device utilisation is measured over the
window since the previous :meth:`SimClusterView.mark` (one scheduling interval).

A what-if is :meth:`service.sim.whatif.WhatIf.replica_change` (see there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from service.core.batching import SIM_BATCHING, BatchingConfig
from service.core.scheduler import (
    Applied,
    Decision,
    DeviceInfo,
    ReplicaChange,
    ReplicaInfo,
    SliceSize,
    WhatIfOutcome,
)
from service.core.slot import ClusterState, DeviceView, LinkView, Placement
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.iteration import BatchFeatures, IterationCostTable, kv_bytes_per_token, slice_sizes, weight_bytes
from service.sim.replica import SliceStage
from service.sim.whatif import WhatIf


def replay_model_uid(tenant_id: str, family: str) -> str:
    """A replay tenant's model: one per tenant, named like a live model uid."""
    return f"{tenant_id}/{family}"


class SimClusterView:
    """``batching`` gives a guest replica's limits and the KV reserve a placement needs (replay:
    ``SIM_BATCHING``; the live mirror: ``LIVE_BATCHING``)."""

    def __init__(self, cluster: SimulatedCluster, *, batching: BatchingConfig = SIM_BATCHING,
                 tenant_chunks: dict[str, int] | None = None,
                 model_uid: Callable[[str, str], str] = replay_model_uid) -> None:
        self.cluster = cluster
        self.model_uid = model_uid  # (simulated tenant, family) -> the model uid policies see
        self.tenant_chunks = dict(tenant_chunks or {})  # a guest batches like its tenant's home replicas
        self.batching = batching
        self._busy_mark: dict[str, float] = {}
        self._mark_s = 0.0
        self._utilisation: dict[str, float] = {}
        self._guests = 0
        self._tables: dict[tuple[str, int], IterationCostTable] = {}
        self._whatif = WhatIf(cluster)  # one for all what-ifs: its memo of baselines (see WhatIf)
        self.mark()

    # ---- ClusterView --------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.cluster.now_s

    @property
    def spec(self) -> ClusterSpec:
        return self.cluster.spec

    def mark(self) -> None:
        """Close a utilisation window at the current time."""
        now = self.cluster.now_s
        busy = self.cluster.metrics.busy_s()
        span = now - self._mark_s
        self._utilisation = {d: (b - self._busy_mark.get(d, 0.0)) / span if span > 0 else 0.0
                             for d, b in busy.items()}
        self._busy_mark, self._mark_s = busy, now

    def replicas(self) -> Sequence[ReplicaInfo]:
        out = []
        for rid in self.cluster.replica_ids:
            spec = self.cluster.replica_spec(rid)
            waiting, running, draining, idle = self.cluster.replica_state(rid)
            tenant = spec.tenant_id or rid.split("/")[0]
            out.append(ReplicaInfo(rid, tenant, self.model_uid(tenant, spec.model), spec.model, spec.device_ids,
                                   waiting, running, spec.guest, draining, idle,
                                   yields_to_owners=bool(spec.stages) and not spec.turns))
        return out

    def devices(self) -> Sequence[DeviceInfo]:
        ledger = self.cluster.ledger
        hosting: dict[str, list[str]] = {}
        for rid in self.cluster.replica_ids:
            for d in self.cluster.replica_spec(rid).device_ids:
                hosting.setdefault(d, []).append(rid)
        return [DeviceInfo(d.device_id, d.host_id, ledger.free_bytes(d.device_id),
                           self._utilisation.get(d.device_id, 0.0), tuple(hosting.get(d.device_id, ())))
                for d in self.spec.devices]

    def slot_state(self) -> ClusterState:
        """Devices and links of the spec; each device busy until its committed work ends; all it
        holds now (weights, KV, activations) counted as resident, per replica."""
        spec = self.spec
        devices = {d.device_id: DeviceView(d.device_id, d.host_id, d.kind, self.cluster.ledger.capacity_bytes(d.device_id)
                                          ) for d in spec.devices}
        links = {(x.src, x.dst): LinkView(x.gbps, x.latency_us) for x in spec.links}
        now = self.cluster.now_s
        placements = {}
        for d in spec.devices:
            free_at = self.cluster.device_free_at_s(d.device_id)
            placements[d.device_id] = [Placement(now, free_at, 0)] if free_at > now else []
        resident: dict[str, dict[str, int]] = {}
        for rid in self.cluster.replica_ids:
            rs = self.cluster.replica_spec(rid)
            for device_id in rs.device_ids:
                resident.setdefault(device_id, {})[f"{rs.tenant_id}/{rs.model}"] = 0
        for d in spec.devices:
            resident.setdefault(d.device_id, {})["(in use)"] = self.cluster.ledger.used_bytes(d.device_id)
        return ClusterState(spec.name, devices, links, {}, placements, resident)

    def iteration_s(self, family: str, tp: int) -> float:
        table = self._tables.get((family, tp))
        if table is None:
            config = self.cluster.model_config(family)
            device = self.spec.devices[0]
            table = self._tables[(family, tp)] = IterationCostTable(config, self.cluster.cost_model, device)
        return table.exact_s(BatchFeatures.of([], [1024] * 32)) / tp

    def weight_bytes(self, family: str) -> int:
        return weight_bytes(self.cluster.model_config(family))

    def slice_sizes(self, family: str, layers_per_slice: int) -> Sequence[SliceSize]:
        return slice_sizes(self.cluster.model_config(family), layers_per_slice)

    def kv_reserve_bytes(self, family: str) -> int:
        return self.batching.kv_reserve_tokens * kv_bytes_per_token(self.cluster.model_config(family))

    def what_if(self, change: ReplicaChange, horizon_s: float, *, drain_s: float = 0.0
                ) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        tenant = self._tenant_of(change)
        return self._whatif.replica_change(self._spec(f"{tenant}/whatif", tenant, change), horizon_s,
                                           drain_s=drain_s)

    def drain_what_if(self, replica_id: str, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome]:
        kept, drained = self._whatif.drain(replica_id, horizon_s)
        tenant = self.cluster.replica_spec(replica_id).tenant_id
        return _without(kept, tenant), _without(drained, tenant)

    # ---- applying decisions ----------------------------------------------------------------------
    def apply(self, decision: Decision) -> Applied:
        """Drain, then add each guest replica for real (a change whose weights do not fit is
        skipped)."""
        applied = Applied()
        for rid in decision.drain:
            self.cluster.drain_replica(rid)
            applied.drained.append(rid)
        for change in decision.add:
            tenant = self._tenant_of(change)
            self._guests += 1
            rid = f"{tenant}/{'s' if change.stages else 'g'}{self._guests}"  # s: sliced (operator-level)
            homes = [self.cluster.replica_spec(r).device_ids[0] for r in self.cluster.replica_ids
                     if self.cluster.replica_spec(r).tenant_id == tenant]
            ready = self.cluster.add_replica(self._spec(rid, tenant, change), weights_from=self._source(homes, change))
            if ready is None:
                applied.skipped.append(change)
            else:
                applied.added.append(rid)
        return applied

    def _tenant_of(self, change: ReplicaChange) -> str:
        """The simulated tenant serving ``change.model_uid`` (``tenant/family``)."""
        for rid in self.cluster.replica_ids:
            spec = self.cluster.replica_spec(rid)
            tenant = spec.tenant_id or rid.split("/")[0]
            if self.model_uid(tenant, spec.model) == change.model_uid:
                return tenant
        raise InvalidInputError(f"no replica serves {change.model_uid!r}", culprit=change.model_uid)

    def _spec(self, rid: str, tenant: str, change: ReplicaChange) -> ReplicaSpec:
        chunk = self.tenant_chunks.get(tenant, self.batching.max_batched_tokens)
        return ReplicaSpec(rid, change.family, change.device_ids, max_batched_tokens=chunk,
                           max_num_seqs=self.batching.max_num_seqs, tenant_id=tenant, guest=True,
                           stages=tuple(SliceStage(*st) for st in change.stages), turns=change.turns)

    def _source(self, homes: Sequence[str], change: ReplicaChange) -> str | None:
        """The home device to copy weights from: one with a link to the first target device."""
        for h in homes:
            if h not in change.device_ids and self.spec.link(h, change.device_ids[0]) is not None:
                return h
        return None


def _without(outcome: WhatIfOutcome, tenant: str | None) -> WhatIfOutcome:
    """``outcome`` with no late count for ``tenant`` (a drain what-if counts the others)."""
    return replace(outcome, violations_by_tenant={t: n for t, n in outcome.violations_by_tenant.items() if t != tenant})
