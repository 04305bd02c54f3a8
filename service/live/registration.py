"""What admins (and executors) register: tenants and their keys, models (traced into the GMG),
executors and their devices, pinned replicas. Each persists before the in-memory state changes
where a crash must not lose it (a key, a model's graph), and is in the audit log before it is
answered (:mod:`service.live.audit`)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from service.domain.audit import Actor
from service.domain.error import ConflictError, InvalidInputError
from service.domain.principal import Principal
from service.domain.quota import Quota
from service.live.access import DEFAULT_PROJECT, AccessBook
from service.live.audit import AuditLog, actor_of, key_state
from service.live.credential import hash_key, new_key
from service.live.keys import ExecutorPools
from service.live.metrics import LiveMetrics
from service.live.neo4j_gate import Neo4jGate
from service.live.records import LiveModel, Write
from service.live.state import LiveState


def quota_props(quota: Quota) -> dict[str, Any]:
    """A quota as Tenant or Project properties (null: no limit)."""
    return {"quota_tokens_per_s": quota.tokens_per_s, "quota_device_s_per_hour": quota.device_s_per_hour,
            "quota_mem_bytes": quota.mem_bytes}


def default_seed(tenant_id: str, model_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{tenant_id}/{model_id}".encode()).digest()[:4], "big") >> 1


def model_from_dir(tenant_id: str, model_id: str, path: str, replicas: int) -> LiveModel:
    """A model served from the Hugging Face model directory ``path``, as the service sees it: its
    config, checked weights and tokenizer, read from the same path the executors load (the
    directory must be visible to the service too, e.g. a shared volume). Blocking file reads
    (run it in a thread); ``InvalidInputError`` when the directory does not hold a usable model."""
    from service.models.hf import check_weights, hf_config, model_dir
    from service.models.hf_tokenizer import HFTokenizer

    directory = str(model_dir(path))
    config = hf_config(directory)
    check_weights(directory, config)
    tokenizer = HFTokenizer.load(directory)
    return LiveModel(tenant_id, model_id, config.name, 0, replicas, tokenizer, path=directory, loaded=config)


class Registration:
    """Registrations (a part of :class:`~service.live.service.LiveService`, its parts passed in):
    ``gate`` to Neo4j, the in-memory ``state``, executor ``pools``, tenant quotas (``access``), the
    ``audit`` log, placement ``metrics``, ``persist`` (GMG soft writes), ``replan`` (home replicas
    after a change), ``check_devices`` (a device no model fits on is refused) and ``max_batch``
    (the batch a model's graph is traced at)."""

    def __init__(self, gate: Neo4jGate, state: LiveState, pools: ExecutorPools, access: AccessBook, audit: AuditLog,
                 metrics: LiveMetrics, persist: Callable[[Iterable[Write]], None],
                 replan: Callable[[], Awaitable[None]], check_devices: Callable[[list[tuple[str, str, int]]], None],
                 max_batch: int) -> None:
        self.gate, self.state, self.pools, self.access, self.audit = gate, state, pools, access, audit
        self.metrics, self.persist, self.replan, self.check_devices = metrics, persist, replan, check_devices
        self.max_batch = max_batch

    async def create_tenant(self, actor: Actor, tenant_id: str, sla_class: str, weight: float,
                            priority: int, quota: Quota | None = None, *, issue_key: bool = True) -> str | None:
        """A new tenant with its quota; its key (returned once) is in Neo4j before it is usable.
        ``issue_key`` False (an approved onboarding): no key yet, the claim issues it."""
        if tenant_id in self.state.tenants:
            raise ConflictError(f"tenant {tenant_id!r} exists")
        key = new_key(tenant_id) if issue_key else None
        key_hash = hash_key(key) if key is not None else None
        quota = quota or Quota()
        self.state.check_tenant(sla_class, weight)
        assert self.gate.repo is not None
        props: dict[str, Any] = {"sla_class": sla_class, "weight": weight, "priority": priority, "key_hash": key_hash,
                                 **quota_props(quota)}
        if not issue_key:
            props["approved_at"] = time.time()
        await self.gate.db(self.gate.repo.models.upsert_tenant, tenant_id, **props)  # persisted first: a key never outlives a crash unrecorded
        await self.gate.db(self.gate.repo.governance.upsert_project, tenant_id, DEFAULT_PROJECT, description="the tenant's default project",
                           created_at=time.time(), **quota_props(Quota()))
        self.state.add_tenant(tenant_id, sla_class, weight, priority, key_hash)
        self.access.tenant_quota[tenant_id] = quota
        await self.audit.append(actor, "tenant.create", "tenant", tenant_id, tenant_id,
                                after={"sla_class": sla_class, "weight": weight, "priority": priority,
                                      "quota": quota.to_dict(), **key_state(key_hash)})
        return key

    def check_mem_quota(self, model: LiveModel) -> None:
        """Refuse (409) a model whose weights would take its tenant past its ``mem_bytes`` quota."""
        quota = self.access.quota_of(model.tenant_id).mem_bytes
        if quota is None:
            return
        held = sum(m.weight_bytes for m in self.state.models.values() if m.tenant_id == model.tenant_id)
        if held + model.weight_bytes > quota:
            raise ConflictError(f"model {model.model_id!r} holds {model.weight_bytes} bytes of weights; with the "
                                f"{held} its tenant's models hold that exceeds its memory quota of {quota} bytes "
                                "(ask for more with an access request)")

    async def create_model(self, actor: Actor, tenant_id: str, model_id: str, family: str | None,
                           seed: int | None, replicas: int, path: str | None = None) -> LiveModel:
        """Register a built-in runnable model (``family``, weights from ``seed``) or a model directory
        (``path``): its prefill and decode graphs are traced into the GMG (on the meta device), then
        it is live and the home planner runs. Nothing is written when the model is refused."""
        if (family is None) == (path is None):
            raise InvalidInputError("give exactly one of family (a built-in model) and path (a model directory)")
        if path is not None and seed is not None:
            raise InvalidInputError("seed applies to built-in families: a model directory brings its weights")
        self.state.check_new_model(tenant_id, model_id, family)
        if path is not None:
            model = await asyncio.to_thread(model_from_dir, tenant_id, model_id, path, replicas)
            self.state.check_new_model(tenant_id, model_id, None)  # registered meanwhile?
        else:
            assert family is not None
            seed = seed if seed is not None else default_seed(tenant_id, model_id)
            model = LiveModel(tenant_id, model_id, family, seed, replicas)
        self.check_mem_quota(model)  # a model directory's too: its size is known once its config is read
        assert self.gate.repo is not None
        repo = self.gate.repo

        def trace_and_write() -> None:
            from service.models.trace import trace_phase

            config = model.config
            for phase in ("prefill", "decode"):
                graph = trace_phase(config, phase, batch=self.max_batch, tokens=min(64, config.max_seq_len),
                                    context=min(256, config.max_seq_len - 1))
                repo.models.import_model(tenant_id, model_id, graph, create_tenant=False)
            repo.models.upsert_model(tenant_id, model_id, family=model.family, seed=model.seed, replicas=replicas,
                                     path=model.path)

        await self.gate.db(trace_and_write, bound_s=None)
        self.state.add_model(model)
        await self.audit.append(actor, "model.register", "model", model.uid, tenant_id, models=[model.uid],
                                after={"family": model.family, "seed": model.seed, "replicas": replicas, "path": model.path,
                                      "weight_bytes": model.weight_bytes})
        await self.replan()
        return model

    async def register_executor(self, p: Principal, executor_id: str, host_id: str,
                                devices: list[tuple[str, str, int]], stage_url: str | None) -> None:
        """Register (or re-register) an executor's devices, within the key's pool, then replan."""
        names = [d for d, _, _ in devices]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"duplicate device names in {names}")
        self.pools.check_registration(p, self.state, executor_id, devices)  # the key's pool: kinds and limits
        self.check_devices(devices)  # a device no model fits on: refused before anything is registered
        before = self._executor_state(executor_id)
        self.persist(self.state.register_executor(executor_id, host_id, devices, stage_url))
        self.pools.bind(p, executor_id)
        await self.audit.append(actor_of(p, executor_id), "executor.register", "executor", executor_id,
                                before=before, after=self._executor_state(executor_id),
                                details={"pool": p.pool_id}, pools=[p.pool_id] if p.pool_id else [])
        await self.replan()

    async def deregister_executor(self, p: Principal, executor_id: str) -> None:
        self.pools.check_owner(p, executor_id)
        self.state.executor(executor_id)
        before = self._executor_state(executor_id)
        self.persist(self.state.drop_executor(executor_id))
        await self.audit.append(actor_of(p, executor_id), "executor.deregister", "executor", executor_id, before=before,
                                details={"pool": p.pool_id}, pools=[p.pool_id] if p.pool_id else [])
        await self.replan()

    def _executor_state(self, executor_id: str) -> dict[str, Any] | None:
        """An executor as the audit log shows it (None: not registered)."""
        e = self.state.executors.get(executor_id)
        if e is None:
            return None
        devices = [self.state.devices[d] for d in e.device_ids if d in self.state.devices]
        return {"host_id": e.host_id, "stage_url": e.stage_url,
                "devices": [{"device_id": d.device_id, "kind": d.kind, "mem_bytes": d.mem_bytes} for d in devices]}

    async def pin_replica(self, actor: Actor, tenant_id: str, model_id: str,
                          device_ids: list[str]) -> dict[str, Any]:
        """A replica of the model on these devices in layer order, if each has the memory for its share."""
        state = self.state
        model = state.model(tenant_id, model_id)
        unknown = [d for d in device_ids if d not in state.devices]
        if unknown:
            raise InvalidInputError(f"unknown devices {unknown}")
        if len(set(device_ids)) != len(device_ids) or len(device_ids) > model.config.n_layers:
            raise InvalidInputError(f"need distinct devices, at most one per layer ({model.config.n_layers})")
        need = (model.weight_bytes + state.kv_reserve_bytes(model)) // len(device_ids)
        short = [d for d in device_ids if state.free_bytes(d) < need]
        if short:
            raise InvalidInputError(f"not enough free memory for {need} bytes per device on {short}")
        if f"{model.uid}@{'+'.join(device_ids)}" in state.replicas:
            raise ConflictError("that replica exists")
        replica = state.add_replica(model.uid, tuple(device_ids), guest=False, pinned=True)
        self.metrics.placed("admin", "add", [replica])
        await self.audit.append(actor, "replica.pin", "model", model.uid, tenant_id, models=[model.uid],
                                after={"replica_id": replica.replica_id, "device_ids": list(replica.device_ids)})
        await self.replan()
        return {"replica_id": replica.replica_id, "device_ids": list(replica.device_ids),
                "stages": [s.to_json() for s in state.stages(replica, state.devices[replica.device_ids[0]].executor_id,
                                                             model.config.n_layers)]}
