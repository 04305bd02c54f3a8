"""Devices, executors (register, heartbeat, deregister) and pinned replicas."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api import reports
from service.api.deps import AdminPrincipal, ExecutorPrincipal, Svc
from service.api.responses import (
    DeviceOut,
    ExecutorRegisteredOut,
    ExecutorRemovedOut,
    HeartbeatOut,
    PinnedReplicaOut,
)
from service.api.schemas import ExecutorIn, HeartbeatIn, ReplicaIn
from service.live.audit import actor_of

router = APIRouter(tags=["executors"])


@router.get("/v1/devices", response_model=list[DeviceOut])
async def list_devices(svc: Svc, _: AdminPrincipal) -> list[dict[str, Any]]:
    return reports.devices_public(svc)


@router.post("/v1/executors", response_model=ExecutorRegisteredOut)
async def register_executor(body: ExecutorIn, svc: Svc, p: ExecutorPrincipal) -> dict[str, Any]:
    await svc.registration.register_executor(p, body.executor_id, body.host_id,
                                             [(d.device_id, d.kind, d.mem_bytes) for d in body.devices], body.stage_url)
    return {"executor_id": body.executor_id, "lease_ttl_s": svc.settings.lease_ttl_s,
            "heartbeat_s": svc.settings.heartbeat_s,
            "devices": {d.device_id: f"{body.executor_id}/{d.device_id}" for d in body.devices}}


@router.post("/v1/executors/{executor_id}/heartbeat", response_model=HeartbeatOut)
async def heartbeat(executor_id: str, body: HeartbeatIn, svc: Svc, p: ExecutorPrincipal) -> dict[str, Any]:
    svc.pools.check_owner(p, executor_id)
    renewed, cancel = svc.heartbeat(executor_id, body.busy_s, body.running)
    return {"renewed": renewed, "cancel": cancel, "drain": False}


@router.delete("/v1/executors/{executor_id}", response_model=ExecutorRemovedOut)
async def deregister_executor(executor_id: str, svc: Svc, p: ExecutorPrincipal) -> dict[str, Any]:
    await svc.registration.deregister_executor(p, executor_id)
    return {"executor_id": executor_id, "removed": True}


@router.post("/v1/replicas", status_code=201, response_model=PinnedReplicaOut,
             response_model_exclude_unset=True)  # a stage's url: only for another executor's
async def pin_replica(body: ReplicaIn, svc: Svc, p: AdminPrincipal) -> dict[str, Any]:
    """Admin: place a replica of a model on these devices, layers split over them in order (they
    may belong to different executors: the leading executor runs the others' layers over HTTP).
    The home planner leaves it alone; it goes when one of its devices does."""
    return await svc.registration.pin_replica(actor_of(p), body.tenant_id, body.model_id, body.device_ids)
