"""The live service's registry: tenants (with key hashes), models, executors, their devices and
the replicas placed on them.

What is registered and where it sits; no request or lease lives here (that is the
:class:`~service.live.lease_book.LeaseBook`). Owned by the API process's event loop (no locks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from itertools import pairwise
from typing import Any

from service.core.batching import LIVE_BATCHING
from service.core.scheduler import Applied, Decision
from service.domain.error import ConflictError, InvalidInputError, NotFoundError
from service.domain.wire import WireStage
from service.live.records import LIVE_FAMILIES, LiveDevice, LiveExecutor, LiveModel, LiveReplica, LiveTenant
from service.sim.iteration import kv_bytes_per_token
from service.sim.sla import SLA_CLASSES


class ReplicaMap(dict[str, LiveReplica]):
    """The replicas by id, counting its changes (:attr:`version`) so that indexes built from it
    know when they are stale."""

    version = 0

    def __setitem__(self, key: str, value: LiveReplica) -> None:
        self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.version += 1
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(key, *default)

    def clear(self) -> None:
        self.version += 1
        super().clear()

    def popitem(self) -> tuple[str, LiveReplica]:
        self.version += 1
        return super().popitem()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.version += 1
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.version += 1
        super().update(*args, **kwargs)


class Registry:
    def __init__(self, *, clock: Callable[[], float], max_batch: int = 8,
                 kv_reserve_tokens: int = LIVE_BATCHING.kv_reserve_tokens) -> None:
        self.clock = clock
        self.max_batch = max_batch
        self.kv_reserve_tokens = kv_reserve_tokens
        self.tenants: dict[str, LiveTenant] = {}
        self.by_key_hash: dict[str, str] = {}
        self.models: dict[str, LiveModel] = {}
        self.devices: dict[str, LiveDevice] = {}
        self.executors: dict[str, LiveExecutor] = {}
        self.replicas: ReplicaMap = ReplicaMap()
        self._index_version = -1  # of the two indexes below, rebuilt when :attr:`replicas` changes
        self._led_on: dict[str, list[LiveReplica]] = {}  # first device -> replicas, by (guest, id)
        self._of_model: dict[str, list[LiveReplica]] = {}

    # ---- tenants and models -------------------------------------------------------------------
    @staticmethod
    def check_tenant(sla_class: str, weight: float) -> None:
        if sla_class not in SLA_CLASSES:
            raise InvalidInputError(f"unknown SLA class {sla_class!r} (known: {', '.join(SLA_CLASSES)})")
        if not (0.0 < weight < math.inf):
            raise InvalidInputError(f"weight must be finite and > 0, got {weight}")

    def add_tenant(self, tenant_id: str, sla_class: str, weight: float, priority: int,
                   key_hash: str | None) -> LiveTenant:
        self.check_tenant(sla_class, weight)
        tenant = LiveTenant(tenant_id, sla_class, weight, priority, key_hash)
        self.tenants[tenant_id] = tenant
        if key_hash is not None:
            self.by_key_hash[key_hash] = tenant_id
        return tenant

    def set_tenant_key(self, tenant_id: str, key_hash: str | None) -> None:
        """A rotated (new hash) or revoked (``None``) key: the old one is refused from now on."""
        tenant = self.tenant(tenant_id)
        if tenant.key_hash is not None:
            self.by_key_hash.pop(tenant.key_hash, None)
        tenant.key_hash = key_hash
        if key_hash is not None:
            self.by_key_hash[key_hash] = tenant_id

    def tenant(self, tenant_id: str) -> LiveTenant:
        t = self.tenants.get(tenant_id)
        if t is None:
            raise NotFoundError(f"no tenant {tenant_id!r}")
        return t

    def check_new_model(self, tenant_id: str, model_id: str, family: str | None) -> None:
        """``family``: a built-in family (checked); None for a model directory (checked where it is read)."""
        self.tenant(tenant_id)
        if family is not None and family not in LIVE_FAMILIES:
            raise InvalidInputError(f"unknown model family {family!r} (runnable: {', '.join(LIVE_FAMILIES)})")
        if f"{tenant_id}/{model_id}" in self.models:
            raise ConflictError(f"model {model_id!r} already exists for tenant {tenant_id!r}")

    def add_model(self, model: LiveModel) -> None:
        self.models[model.uid] = model

    def model(self, tenant_id: str, model_id: str) -> LiveModel:
        m = self.models.get(f"{tenant_id}/{model_id}")
        if m is None:
            raise NotFoundError(f"no model {model_id!r}")
        return m

    # ---- executors and devices -----------------------------------------------------------------
    def add_executor(self, executor_id: str, host_id: str, devices: list[tuple[str, str, int]],
                     stage_url: str | None = None) -> LiveExecutor:
        """An executor with ``(local name, kind, mem_bytes)`` per device (not yet registered)."""
        ids = []
        for local, kind, mem in devices:
            device_id = f"{executor_id}/{local}"
            self.devices[device_id] = LiveDevice(device_id, local, executor_id, host_id, kind, mem)
            ids.append(device_id)
        executor = LiveExecutor(executor_id, host_id, ids, self.clock(), stage_url=stage_url)
        self.executors[executor_id] = executor
        return executor

    def remove_executor(self, executor_id: str) -> LiveExecutor | None:
        """The executor leaves with its devices and every replica on them (its leases are the
        lease book's to end first); None if it was not registered."""
        e = self.executors.pop(executor_id, None)
        if e is None:
            return None
        for rid in [r.replica_id for r in self.replicas.values() if set(r.device_ids) & set(e.device_ids)]:
            self.replicas.pop(rid)
        for d in e.device_ids:
            self.devices.pop(d, None)
        return e

    def executor(self, executor_id: str) -> LiveExecutor:
        e = self.executors.get(executor_id)
        if e is None:
            raise NotFoundError(f"no executor {executor_id!r}: register first")
        return e

    # ---- replicas ----------------------------------------------------------------------------
    def add_replica(self, model_uid: str, device_ids: tuple[str, ...], *, guest: bool,
                    pinned: bool = False, plan: tuple[tuple[str, int, int], ...] = (),
                    yields: bool = False) -> LiveReplica:
        """A replica of the model on ``device_ids``; ``plan`` (a sliced guest): its slices,
        ``(device_id, start, end)`` in execution order (its id names the cut: ``...@d1:0-12+d2:12-24``)."""
        where = "+".join(f"{d}:{s}-{e}" for d, s, e in plan) if plan else "+".join(device_ids)
        rid = f"{model_uid}@{where}"
        replica = LiveReplica(rid, model_uid, device_ids, guest, self.max_batch, last_active=self.clock(),
                              pinned=pinned, plan=plan, yields=yields)
        self.replicas[rid] = replica
        return replica

    def _index(self) -> None:
        if self._index_version == self.replicas.version:
            return
        led: dict[str, list[LiveReplica]] = {}
        of_model: dict[str, list[LiveReplica]] = {}
        for r in sorted(self.replicas.values(), key=lambda r: (r.guest, r.replica_id)):
            led.setdefault(r.device_ids[0], []).append(r)
            of_model.setdefault(r.model_uid, []).append(r)
        self._led_on, self._of_model, self._index_version = led, of_model, self.replicas.version

    def replicas_led_on(self, device_ids: Iterable[str]) -> list[LiveReplica]:
        """The replicas whose first device is one of ``device_ids`` (home replicas before guests,
        then by id), draining ones included; from an index, not a scan of every replica (a long
        poll asks this on each try: at a thousand executors a scan was the poll's cost)."""
        self._index()
        out = [r for d in device_ids for r in self._led_on.get(d, ())]
        out.sort(key=lambda r: (r.guest, r.replica_id))
        return out

    def replicas_of_model(self, model_uid: str) -> list[LiveReplica]:
        """The model's replicas (draining ones included), from the same index."""
        self._index()
        return self._of_model.get(model_uid, [])

    def apply(self, decision: Decision, devices_of: Mapping[str, tuple[str, ...]]) -> Applied:
        """Carry out a scheduler decision made on compute units (``devices_of``: unit -> its
        devices): drain, then add each guest replica on the roomiest device of each unit (a
        change whose model or units are gone, or a sliced one whose cut does not cover the
        model's layers or that exists already, is skipped). A sliced change (``stages``: units
        and inclusive layer ranges) keeps its cut: each slice on its unit's chosen device, layers
        ``[first, last + 1)``, yielding to the owners unless it takes turns."""
        applied = Applied()
        for rid in decision.drain:
            if rid in self.replicas:
                self.replicas[rid].draining = True
                applied.drained.append(rid)
        for change in decision.add:
            real = {unit: max(members, key=lambda d: (self.free_bytes(d), d))
                    for unit in change.device_ids
                    if (members := [d for d in devices_of.get(unit, ()) if d in self.devices])}
            model = self.models.get(change.model_uid)
            if model is None or len(real) != len(change.device_ids):
                applied.skipped.append(change)
                continue
            devices = tuple(real[u] for u in change.device_ids)
            if not change.stages:
                applied.added.append(self.add_replica(change.model_uid, devices, guest=True).replica_id)
                continue
            plan = tuple((real[u], first, last + 1) for u, first, last in change.stages)
            bounds = [(s, e) for _, s, e in plan]
            covers = bounds[0][0] == 0 and bounds[-1][1] == model.config.n_layers and all(
                s < e for s, e in bounds) and all(a[1] == b[0] for a, b in pairwise(bounds))
            if not covers or any(r.plan == plan for r in self.replicas.values() if r.model_uid == model.uid):
                applied.skipped.append(change)
                continue
            applied.added.append(self.add_replica(change.model_uid, devices, guest=True, plan=plan,
                                                  yields=not change.turns).replica_id)
        return applied

    def kv_reserve_bytes(self, model: LiveModel) -> int:
        return self.kv_reserve_tokens * kv_bytes_per_token(model.config)

    def free_bytes(self, device_id: str) -> int:
        """The device's memory less its replicas' weights and KV reserves: an even share of each
        replica's, or a sliced replica's layers there over the model's."""
        d = self.devices[device_id]
        used = 0
        for r in self.replicas.values():
            if device_id in r.device_ids:
                m = self.models[r.model_uid]
                whole = m.weight_bytes + self.kv_reserve_bytes(m)
                if r.plan:
                    used += whole * sum(e - s for dev, s, e in r.plan if dev == device_id) // m.config.n_layers
                else:
                    used += whole // len(r.device_ids)
        return d.mem_bytes - used

    def remove_drained(self) -> bool:
        """Remove draining replicas that hold no lease; True if any went."""
        gone = [rid for rid, r in self.replicas.items() if r.draining and not r.leases]
        for rid in gone:
            del self.replicas[rid]
        return bool(gone)

    def reachable(self, replica: LiveReplica, executor_id: str) -> bool:
        """Whether ``executor_id`` can lead the replica: every device is its own, or belongs to
        a live executor with a stage server (the layers there run over HTTP)."""
        for d in replica.device_ids:
            owner = self.devices.get(d)
            if owner is None:
                return False
            if owner.executor_id != executor_id and not self.executors[owner.executor_id].stage_url:
                return False
        return True

    def stages(self, replica: LiveReplica, executor_id: str, n_layers: int) -> tuple[WireStage, ...]:
        """The lease's placement: a sliced replica's cut, else layers split evenly over the
        replica's devices in order; a stage on another executor carries that executor's stage
        server URL."""
        plan = replica.plan
        if not plan:
            n = len(replica.device_ids)
            bounds = [round(i * n_layers / n) for i in range(n + 1)]
            plan = tuple((d, bounds[i], bounds[i + 1]) for i, d in enumerate(replica.device_ids))
        out = []
        for d, start, end in plan:
            device = self.devices[d]
            url = self.executors[device.executor_id].stage_url if device.executor_id != executor_id else None
            out.append(WireStage(device.local, start, end, url, global_device_id=d))
        return tuple(out)
