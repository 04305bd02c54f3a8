"""HTTP routes of the live service. Contract: docs/API.md.

Handlers run on the event loop and mutate :class:`LiveState` there; Neo4j calls go to worker
threads. Tenant keys see only their own tenant's objects: anything else is a 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from service.api.app import Principal, authenticate
from service.api.schemas import (
    CompleteIn,
    ExecutorIn,
    FailIn,
    HeartbeatIn,
    InspectIn,
    ModelIn,
    PollIn,
    ReplicaIn,
    RequestBatchIn,
    RequestIn,
    TenantIn,
    WhatIfIn,
)
from service.api.service import LiveService
from service.api.state import (
    STATUSES,
    Completion,
    ConflictError,
    ForbiddenError,
    LiveModel,
    LiveRequest,
    hash_key,
    new_key,
)
from service.domain import tokenizer
from service.domain.error import InvalidInputError, NotFoundError

router = APIRouter()


def service_of(request: Request) -> LiveService:
    svc: LiveService = request.app.state.service
    return svc


Svc = Annotated[LiveService, Depends(service_of)]
Caller = Annotated[Principal, Depends(authenticate)]


def require(p: Principal, *roles: str) -> None:
    if p.role not in roles:
        raise ForbiddenError(f"this needs a key of role {' or '.join(roles)} (yours: {p.role})")


def scoped_tenant(p: Principal, given: str | None) -> str:
    """The tenant a call acts for: a tenant key's own, or the admin's explicit choice."""
    if p.role == "tenant":
        assert p.tenant_id is not None
        if given is not None and given != p.tenant_id:
            raise NotFoundError(f"no tenant {given!r}")
        return p.tenant_id
    require(p, "admin")
    if given is None:
        raise InvalidInputError("admin keys must name the tenant_id")
    return given


# ---- health and metrics --------------------------------------------------------------------------
@router.get("/healthz", tags=["ops"])
async def healthz(svc: Svc) -> dict[str, Any]:
    """Liveness (the process answers; 200 while it runs), with readiness in one word and
    nothing about tenants (no key needed). ``/readyz`` has the details."""
    ready = svc.readiness()["ready"]
    return {"status": "ok" if ready else "degraded", "ready": ready, "neo4j": "up" if svc.db_up else "down",
            "placement": svc.settings.placement, "queue": svc.settings.queue}


@router.get("/readyz", tags=["ops"])
async def readyz(svc: Svc) -> JSONResponse:
    """Readiness: 200 when Neo4j answers and no background loop is stuck, else 503; each
    loop's last successful tick and failures, the GMG writer's backlog (no key needed; nothing
    about tenants)."""
    report = svc.readiness()
    report["unplaced_models"] = len(report["unplaced_models"])  # model names stay admin-only (/v1/stats)
    return JSONResponse(report, status_code=200 if report["ready"] else 503,
                        headers=None if report["ready"] else {"Retry-After": "2"})


@router.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
async def metrics(svc: Svc, p: Caller) -> Response:
    """Prometheus text format; admin key (the labels name tenants). Configure the scrape job
    with ``authorization: {credentials: <admin key>}``."""
    require(p, "admin")
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/stats", tags=["ops"])
async def stats(svc: Svc, p: Caller) -> dict[str, Any]:
    """Admin: counters, GMG write lag and the scheduler's recent decisions."""
    require(p, "admin")
    writer = svc.writer
    lags = sorted(writer.lags_s) if writer else []

    def pct(q: float) -> float | None:
        return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else None

    return {"counters": dict(svc.state.counters), "gmg_write_lag_s": {"p50": pct(0.5), "p99": pct(0.99),
                                                                     "rows": writer.rows_written if writer else 0,
                                                                     "pending": writer.pending if writer else 0},
            "replicas": [{"replica_id": r.replica_id, "model": r.model_uid, "devices": list(r.device_ids),
                          "guest": r.guest, "draining": r.draining, "leases": len(r.leases)}
                         for r in svc.state.replicas.values()],
            "decisions": svc.decisions[-50:], "iteration_s": svc.state.iteration_s,
            "unplaced_models": dict(svc.unplaced), "loops": svc.supervisor.report(),
            "scheduler_steps": len(svc.step_s), "scheduler_step_s_total": sum(svc.step_s),
            "token_budget_mae": (sum(svc.state.calibrator.abs_errors) / len(svc.state.calibrator.abs_errors)
                                 if svc.state.calibrator.abs_errors else None)}


# ---- tenants ---------------------------------------------------------------------------------------
def tenant_public(svc: LiveService, tenant_id: str) -> dict[str, Any]:
    t = svc.state.tenant(tenant_id)
    return {"tenant_id": t.tenant_id, "sla_class": t.sla_class, "weight": t.weight, "priority": t.priority,
            "models": sorted(m.model_id for m in svc.state.models.values() if m.tenant_id == tenant_id)}


@router.post("/v1/tenants", status_code=201, tags=["tenants"])
async def create_tenant(body: TenantIn, svc: Svc, p: Caller) -> dict[str, Any]:
    require(p, "admin")
    if body.tenant_id in svc.state.tenants:
        raise ConflictError(f"tenant {body.tenant_id!r} exists")
    key = new_key(body.tenant_id)
    svc.state.check_tenant(body.sla_class, body.weight)
    assert svc.repo is not None
    await svc.db(svc.repo.upsert_tenant, body.tenant_id, sla_class=body.sla_class, weight=body.weight,
                            priority=body.priority, key_hash=hash_key(key))  # persisted first: a key never outlives a crash unrecorded
    svc.state.add_tenant(body.tenant_id, body.sla_class, body.weight, body.priority, hash_key(key))
    return {**tenant_public(svc, body.tenant_id), "api_key": key}


@router.get("/v1/tenants", tags=["tenants"])
async def list_tenants(svc: Svc, p: Caller) -> list[dict[str, Any]]:
    require(p, "admin")
    return [tenant_public(svc, t) for t in sorted(svc.state.tenants)]


@router.get("/v1/tenants/{tenant_id}", tags=["tenants"])
async def get_tenant(tenant_id: str, svc: Svc, p: Caller) -> dict[str, Any]:
    return tenant_public(svc, scoped_tenant(p, tenant_id))


# ---- models --------------------------------------------------------------------------------------
def model_public(m: LiveModel) -> dict[str, Any]:
    c = m.config
    return {"tenant_id": m.tenant_id, "model_id": m.model_id, "family": m.family, "seed": m.seed,
            "replicas": m.replicas, "num_params": c.num_params(), "weight_bytes": m.weight_bytes,
            "max_context": c.max_seq_len, "vocab_size": c.vocab_size}


@router.post("/v1/models", status_code=201, tags=["models"])
async def create_model(body: ModelIn, svc: Svc, p: Caller) -> dict[str, Any]:
    """Register one of the built-in runnable models; its operator graph is traced into the GMG."""
    from service.models.family import model_config
    from service.models.trace import trace_phase

    tenant_id = scoped_tenant(p, body.tenant_id)
    svc.state.check_new_model(tenant_id, body.model_id, body.family)
    seed = body.seed if body.seed is not None else int.from_bytes(
        hashlib.sha256(f"{tenant_id}/{body.model_id}".encode()).digest()[:4], "big") >> 1
    model = LiveModel(tenant_id, body.model_id, body.family, seed, body.replicas)
    assert svc.repo is not None
    repo = svc.repo

    def trace_and_write() -> None:
        config = model_config(body.family)
        for phase in ("prefill", "decode"):
            graph = trace_phase(config, phase, batch=svc.settings.max_batch, tokens=64, context=256)
            repo.import_model(tenant_id, body.model_id, graph, create_tenant=False)
        repo.upsert_model(tenant_id, body.model_id, family=body.family, seed=seed, replicas=body.replicas)

    await svc.db(trace_and_write, bound_s=None)
    svc.state.add_model(model)
    await svc.replan()
    return model_public(model)


@router.get("/v1/models", tags=["models"])
async def list_models(svc: Svc, p: Caller, tenant_id: str | None = None) -> list[dict[str, Any]]:
    if p.role == "tenant":
        tenant_id = scoped_tenant(p, tenant_id)
    else:
        require(p, "admin")
    return [model_public(m) for m in sorted(svc.state.models.values(), key=lambda m: m.uid)
            if tenant_id is None or m.tenant_id == tenant_id]


@router.get("/v1/models/{model_id}", tags=["models"])
async def get_model(model_id: str, svc: Svc, p: Caller, tenant_id: str | None = None) -> dict[str, Any]:
    return model_public(svc.state.model(scoped_tenant(p, tenant_id), model_id))


# ---- devices and executors -----------------------------------------------------------------------
@router.get("/v1/devices", tags=["executors"])
async def list_devices(svc: Svc, p: Caller) -> list[dict[str, Any]]:
    require(p, "admin")
    s = svc.state
    return [{"device_id": d.device_id, "executor_id": d.executor_id, "host_id": d.host_id, "kind": d.kind,
             "mem_bytes": d.mem_bytes, "free_bytes": s.free_bytes(d.device_id),
             "replicas": sorted(r.replica_id for r in s.replicas.values() if d.device_id in r.device_ids)}
            for d in sorted(s.devices.values(), key=lambda d: d.device_id)]


@router.post("/v1/executors", tags=["executors"])
async def register_executor(body: ExecutorIn, svc: Svc, p: Caller) -> dict[str, Any]:
    require(p, "admin", "executor")
    names = [d.device_id for d in body.devices]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"duplicate device names in {names}")
    devices = [(d.device_id, d.kind, d.mem_bytes) for d in body.devices]
    svc.pools.check_registration(p, svc.state, body.executor_id, devices)  # the key's pool: kinds and limits
    svc.check_devices(devices)  # a device no model fits on: refused before anything is registered
    svc.persist(svc.state.register_executor(body.executor_id, body.host_id, devices, body.stage_url))
    svc.pools.bind(p, body.executor_id)
    await svc.replan()
    return {"executor_id": body.executor_id, "lease_ttl_s": svc.settings.lease_ttl_s,
            "heartbeat_s": svc.settings.heartbeat_s,
            "devices": {d.device_id: f"{body.executor_id}/{d.device_id}" for d in body.devices}}


@router.post("/v1/executors/{executor_id}/heartbeat", tags=["executors"])
async def heartbeat(executor_id: str, body: HeartbeatIn, svc: Svc, p: Caller) -> dict[str, Any]:
    require(p, "admin", "executor")
    svc.pools.check_owner(p, executor_id)
    renewed, cancel = svc.state.heartbeat(executor_id, body.busy_s, body.running)
    return {"renewed": renewed, "cancel": cancel, "drain": False}


@router.delete("/v1/executors/{executor_id}", tags=["executors"])
async def deregister_executor(executor_id: str, svc: Svc, p: Caller) -> dict[str, Any]:
    require(p, "admin", "executor")
    svc.pools.check_owner(p, executor_id)
    svc.state.executor(executor_id)
    svc.persist(svc.state.drop_executor(executor_id))
    await svc.replan()
    return {"executor_id": executor_id, "removed": True}


@router.post("/v1/replicas", status_code=201, tags=["executors"])
async def pin_replica(body: ReplicaIn, svc: Svc, p: Caller) -> dict[str, Any]:
    """Admin: place a replica of a model on these devices, layers split over them in order (they
    may belong to different executors: the leading executor runs the others' layers over HTTP).
    The home planner leaves it alone; it goes when one of its devices does."""
    require(p, "admin")
    state = svc.state
    model = state.model(body.tenant_id, body.model_id)
    unknown = [d for d in body.device_ids if d not in state.devices]
    if unknown:
        raise InvalidInputError(f"unknown devices {unknown}")
    if len(set(body.device_ids)) != len(body.device_ids) or len(body.device_ids) > model.config.n_layers:
        raise InvalidInputError(f"need distinct devices, at most one per layer ({model.config.n_layers})")
    need = (model.weight_bytes + state.kv_reserve_bytes(model)) // len(body.device_ids)
    short = [d for d in body.device_ids if state.free_bytes(d) < need]
    if short:
        raise InvalidInputError(f"not enough free memory for {need} bytes per device on {short}")
    if f"{model.uid}@{'+'.join(body.device_ids)}" in state.replicas:
        raise ConflictError("that replica exists")
    replica = state.add_replica(model.uid, tuple(body.device_ids), guest=False, pinned=True)
    await svc.replan()
    return {"replica_id": replica.replica_id, "device_ids": list(replica.device_ids),
            "stages": state.stages(replica, state.devices[replica.device_ids[0]].executor_id, model.config.n_layers)}


# ---- requests ------------------------------------------------------------------------------------
def request_public(req: LiveRequest) -> dict[str, Any]:
    return {**req.public(), "text": tokenizer.decode(req.output_tokens)}


def _new_request(svc: LiveService, p: Principal, body: RequestIn, idempotency_key: str | None) -> LiveRequest:
    tenant_id = scoped_tenant(p, body.tenant_id)
    if (body.prompt is None) == (body.prompt_tokens is None):
        raise InvalidInputError("give exactly one of prompt (text) and prompt_tokens (ids)")
    prompt = tokenizer.encode(body.prompt) if body.prompt is not None else list(body.prompt_tokens or [])
    req = svc.state.new_request(tenant_id, body.model_id, prompt, body.max_tokens, body.sla_class)
    if idempotency_key is not None:
        req.idempotency_key = idempotency_key
        req.body_sha = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
    return req


IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$",
                                              description="a retry with the same key (same tenant) returns the "
                                                          "first answer and creates nothing")]


def _accepted(req: LiveRequest) -> dict[str, Any]:
    return {"request_id": req.request_id, "status": req.status, "token_budget": req.token_budget,
            "prompt_tokens": len(req.prompt)}


@router.post("/v1/requests", status_code=202, tags=["requests"])
async def submit(body: RequestIn, svc: Svc, p: Caller, idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    """Submit a request; it is in Neo4j when this answers. With an ``Idempotency-Key``, a retry
    returns the first request (409 if the body differs) and never creates a second."""
    req = _new_request(svc, p, body, idempotency_key)
    (answer,) = await svc.accept_requests([req])
    return _accepted(answer)


@router.post("/v1/requests/batch", status_code=202, tags=["requests"])
async def submit_batch(body: RequestBatchIn, svc: Svc, p: Caller,
                       idempotency_key: IdempotencyKey = None) -> dict[str, Any]:
    """Submit up to 1,000 requests at once: all are accepted, or none (the error names the first
    bad one). With an ``Idempotency-Key``, item ``i`` carries the key ``<key>#<i>``: a retry of
    the batch returns the first requests and creates none."""
    reqs = []
    for i, item in enumerate(body.requests):
        try:
            reqs.append(_new_request(svc, p, item, None if idempotency_key is None else f"{idempotency_key}#{i}"))
        except InvalidInputError as exc:
            raise InvalidInputError(f"requests[{i}]: {exc}") from None
    answers = await svc.accept_requests(reqs)
    return {"accepted": [_accepted(r) for r in answers]}


@router.get("/v1/requests/{request_id}", tags=["requests"])
async def get_request(request_id: str, svc: Svc, p: Caller) -> dict[str, Any]:
    return request_public(svc.state.request(request_id, None if p.is_admin else _tenant_only(p)))


@router.get("/v1/requests", tags=["requests"])
async def list_requests(svc: Svc, p: Caller,
                        status: Annotated[str | None, Query(json_schema_extra={"enum": list(STATUSES)})] = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[dict[str, Any]]:
    if status is not None and status not in STATUSES:
        raise InvalidInputError(f"unknown status {status!r} (valid: {', '.join(STATUSES)})")
    tenant = None if p.is_admin else _tenant_only(p)
    out = [request_public(r) for r in svc.state.requests.values()
           if (tenant is None or r.tenant_id == tenant) and (status is None or r.status == status)]
    return out[-limit:]


@router.post("/v1/requests/{request_id}/cancel", tags=["requests"])
async def cancel(request_id: str, svc: Svc, p: Caller) -> dict[str, Any]:
    """Cancel a request; the cancel is in Neo4j when this answers (409 if it already finished)."""
    state = svc.state
    req = state.request(request_id, None if p.is_admin else _tenant_only(p))
    state.begin_finish(req)
    await svc.finish(req, state.cancel_row(req), lambda: state.cancel(req))
    return request_public(req)


def _tenant_only(p: Principal) -> str:
    require(p, "tenant")
    assert p.tenant_id is not None
    return p.tenant_id


# ---- leases --------------------------------------------------------------------------------------
@router.post("/v1/leases/poll", tags=["leases"], response_class=JSONResponse)
async def poll(body: PollIn, svc: Svc, p: Caller) -> JSONResponse:
    """Long poll: the next leases for the executor's devices, waiting up to ``wait_s`` for work."""
    require(p, "admin", "executor")
    svc.pools.check_owner(p, body.executor_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait_s
    state = svc.state
    while True:
        woken = svc.work.event()
        grants = state.grant(body.executor_id, body.max_leases)
        if grants or body.max_leases == 0:
            svc.persist(state.slice_row(lease, "leased") for lease, _, _ in grants)
            leases = []
            for lease, replica, req in grants:
                model = state.models[req.model_uid]
                stages = state.stages(replica, body.executor_id, model.config.n_layers)
                leases.append({"lease_id": lease.lease_id, "request_id": req.request_id, "tenant_id": req.tenant_id,
                               "model_id": req.model_id, "family": model.family, "seed": model.seed,
                               "replica_id": replica.replica_id, "stages": stages, "prompt_tokens": req.prompt,
                               "max_tokens": req.max_tokens, "expires_in_s": svc.settings.lease_ttl_s})
            return JSONResponse({"leases": leases})  # plain JSON: the hot path skips response encoding
        remaining = deadline - loop.time()
        if remaining <= 0:
            return JSONResponse({"leases": []})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), remaining)


@router.post("/v1/leases/{lease_id}/renew", tags=["leases"])
async def renew(lease_id: str, svc: Svc, p: Caller) -> dict[str, Any]:
    require(p, "admin", "executor")
    svc.pools.check_lease(p, svc.state, lease_id)
    return {"lease_id": lease_id, "expires_in_s": svc.state.renew(lease_id)}


@router.post("/v1/leases/complete", tags=["leases"], response_class=JSONResponse)
async def complete(body: CompleteIn, svc: Svc, p: Caller) -> JSONResponse:
    """Completions of leases; each is accepted only if its lease is live (exactly once)."""
    require(p, "admin", "executor")
    svc.pools.check_owner(p, body.executor_id)
    accepted, rejected = await svc.complete(body.executor_id, [
        Completion(c.lease_id, list(c.output_tokens), c.queued_s, c.ttft_s, c.e2e_s, c.iterations, c.busy_s,
                   c.peak_bytes) for c in body.results])
    return JSONResponse({"accepted": accepted, "rejected": rejected})


@router.post("/v1/leases/{lease_id}/fail", tags=["leases"])
async def fail(lease_id: str, body: FailIn, svc: Svc, p: Caller) -> dict[str, Any]:
    require(p, "admin", "executor")
    svc.pools.check_owner(p, body.executor_id)
    svc.pools.check_lease(p, svc.state, lease_id)
    state = svc.state
    final = state.fail_row(lease_id, body.executor_id, body.reason)
    if final is None:  # the request goes back to its queue: soft state
        svc.persist(state.fail(lease_id, body.executor_id, body.reason))
        svc.work.notify()
    else:  # out of attempts: the request's failure is written before the answer
        req = state.requests[state.leases[lease_id].request_id]
        await svc.finish(req, final, lambda: state.fail(lease_id, body.executor_id, body.reason))
    return {"lease_id": lease_id, "failed": True}


# ---- what-if and inspection ----------------------------------------------------------------------
@router.post("/v1/whatif", tags=["scheduling"])
async def what_if(body: WhatIfIn, svc: Svc, p: Caller) -> dict[str, Any]:
    """Admin: predict the next ``horizon_s`` with and without a replica of a model on
    ``device_ids``; or, with ``placement: slice``, what the slice policy would change now."""
    require(p, "admin")
    if body.placement is not None:
        if body.device_ids is not None:
            raise InvalidInputError("give either a candidate placement (tenant_id, model_id, device_ids) or placement")
        return await asyncio.to_thread(svc.policy_what_if, body.horizon_s)
    if body.tenant_id is None or body.model_id is None or body.device_ids is None:
        raise InvalidInputError("a candidate placement needs tenant_id, model_id and device_ids")
    svc.state.model(body.tenant_id, body.model_id)
    return await asyncio.to_thread(svc.what_if, f"{body.tenant_id}/{body.model_id}", tuple(body.device_ids),
                                   body.horizon_s)


@router.post("/v1/inspect", tags=["inspection"])
async def inspect(body: InspectIn, svc: Svc, p: Caller) -> dict[str, Any]:
    """Read-only Cypher (admin) or a named query; tenant keys run named queries scoped to themselves."""
    assert svc.repo is not None
    repo = svc.repo
    if (body.query is None) == (body.name is None):
        raise InvalidInputError("give exactly one of query (Cypher) and name (a named query)")
    params = dict(body.params)
    if p.role == "tenant":
        if body.query is not None:
            raise ForbiddenError("tenant keys run named queries (raw Cypher is for admin keys)")
        assert body.name is not None
        q = repo.catalog.get(body.name)
        if q.category != "inspect" or "tenant_id" not in q.params:
            raise NotFoundError(f"no tenant-scoped query {body.name!r} (yours: {', '.join(_scoped_names(svc))})")
        params["tenant_id"] = scoped_tenant(p, params.get("tenant_id"))
    else:
        require(p, "admin")
    if body.query is not None:
        table = await svc.db(repo.run_read, body.query, params, bound_s=30.0)
    else:
        assert body.name is not None
        table = await svc.db(repo.run_named, body.name, params, bound_s=30.0)
    return {"columns": table.columns, "rows": table.rows}


def _scoped_names(svc: LiveService) -> list[str]:
    assert svc.repo is not None
    return [q.name for q in svc.repo.inspection_queries() if "tenant_id" in q.params]
