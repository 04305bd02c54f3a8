"""What the API reports: the public form of tenants, models, devices and requests; the admin's
stats (write-lag percentiles, counters, recent decisions); what-if predictions; Cypher inspection
(raw for admins, named and scoped to themselves for tenants)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.domain.error import ForbiddenError, InvalidInputError, NotFoundError
from service.domain.principal import Principal, require, scoped_projects, scoped_tenant
from service.domain.role import AUDIT_READ
from service.domain.table import Table
from service.domain.tokenizer import BYTES, Tokenizer
from service.live.records import LiveModel, LiveRequest

if TYPE_CHECKING:
    from service.live.service import LiveService


def tenant_public(svc: LiveService, tenant_id: str) -> dict[str, Any]:
    t = svc.reads.tenant(tenant_id)
    return {"tenant_id": t.tenant_id, "sla_class": t.sla_class, "weight": t.weight, "priority": t.priority,
            "models": sorted(m.model_id for m in svc.reads.models(tenant_id)),
            "key": "active" if t.key_hash is not None else "revoked"}


def model_public(m: LiveModel) -> dict[str, Any]:
    c = m.config
    return {"tenant_id": m.tenant_id, "model_id": m.model_id, "family": m.family, "seed": m.seed,
            "replicas": m.replicas, "num_params": c.num_params(), "weight_bytes": m.weight_bytes,
            "max_context": c.max_seq_len, "vocab_size": c.vocab_size, "path": m.path}


def devices_public(svc: LiveService) -> list[dict[str, Any]]:
    return [{"device_id": d.device_id, "executor_id": d.executor_id, "host_id": d.host_id, "kind": d.kind,
             "mem_bytes": d.mem_bytes, "free_bytes": free_bytes, "replicas": replicas}
            for d, free_bytes, replicas in svc.reads.devices()]


def request_public(svc: LiveService, req: LiveRequest) -> dict[str, Any]:
    """The request as its tenant sees it; ``text``: the output decoded by its model's tokenizer."""
    model = svc.reads.model_by_uid(req.model_uid)
    tokenizer: Tokenizer = model.tokenizer if model is not None else BYTES
    return {**req.public(), "text": tokenizer.decode(req.output_tokens)}


def accepted_public(req: LiveRequest) -> dict[str, Any]:
    return {"request_id": req.request_id, "status": req.status, "token_budget": req.token_budget,
            "prompt_tokens": len(req.prompt)}


def stats(svc: LiveService) -> dict[str, Any]:
    """Counters, GMG write lag and the scheduler's recent decisions."""
    reads = svc.reads
    errors = reads.token_budget_errors()
    return {"counters": reads.counters(), "gmg_write_lag_s": reads.gmg_writes(),
            "replicas": [{"replica_id": r.replica_id, "model": r.model_uid, "devices": list(r.device_ids),
                          "guest": r.guest, "draining": r.draining, "leases": len(r.leases),
                          **({"slices": [{"device": d, "layers": [s, e]} for d, s, e in r.plan],
                              "yields": r.yields} if r.plan else {})}
                         for r in reads.replicas()],
            "decisions": svc.loop.decisions[-50:], "decision_reasons": svc.loop.decision_reasons[-50:],
            "step_status": svc.loop.step_status, "iteration_s": reads.iteration_s(),
            "queue_policy": reads.queue_policy_name(),
            "unplaced_models": dict(svc.unplaced), "loops": svc.supervisor.report(),
            "scheduler_steps": len(svc.loop.step_s), "scheduler_step_s_total": sum(svc.loop.step_s),
            "token_budget_mae": sum(errors) / len(errors) if errors else None}


async def what_if(svc: LiveService, tenant_id: str | None, model_id: str | None, device_ids: list[str] | None,
                  placement: str | None, horizon_s: float) -> dict[str, Any]:
    """A candidate placement's prediction, or (``placement``) what the slice policy would change now."""
    if placement is not None:
        if device_ids is not None:
            raise InvalidInputError("give either a candidate placement (tenant_id, model_id, device_ids) or placement")
        answer: dict[str, Any] = await svc.in_thread(svc.policy_what_if, horizon_s)
        return answer
    if tenant_id is None or model_id is None or device_ids is None:
        raise InvalidInputError("a candidate placement needs tenant_id, model_id and device_ids")
    svc.reads.model(tenant_id, model_id)
    outcome: dict[str, Any] = await svc.in_thread(svc.what_if, f"{tenant_id}/{model_id}", tuple(device_ids), horizon_s)
    return outcome


#: Named queries a tenant key needs more than reading for: the audit log, as ``GET /v1/audit``.
_NAMED_ROLES: dict[str, tuple[str, ...]] = {"audit_log": AUDIT_READ}
#: Tenant-scoped named queries about the tenant's models (which every key of it reads), not its
#: projects' work: a key limited to projects runs them whole.
_TENANT_WIDE = frozenset({"dependency_chain", "heaviest_operators"})


async def inspect(svc: LiveService, p: Principal, query: str | None, name: str | None,
                  params: dict[str, Any]) -> Table:
    """Read-only Cypher (admin) or a named query; a tenant key runs named queries scoped to itself
    (its tenant, and a key limited to projects its projects, where the query takes ``projects``)."""
    reads = svc.reads
    if (query is None) == (name is None):
        raise InvalidInputError("give exactly one of query (Cypher) and name (a named query)")
    params = dict(params)
    if p.is_tenant:
        if query is not None:
            raise ForbiddenError("tenant keys run named queries (raw Cypher is for admin keys)")
        assert name is not None
        q = reads.named_query(name)
        if q.category != "inspect" or "tenant_id" not in q.params:
            raise NotFoundError(f"no tenant-scoped query {name!r} (yours: {', '.join(_scoped_names(svc))})")
        if name in _NAMED_ROLES:
            require(p, *_NAMED_ROLES[name])
        params["tenant_id"] = scoped_tenant(p, params.get("tenant_id"))
        if "projects" in q.params:
            params["projects"] = scoped_projects(p, params.get("projects"))
        elif p.projects and name not in _TENANT_WIDE:  # it cannot tell the tenant's other projects apart
            raise ForbiddenError(f"{name!r} shows the whole tenant's work: a key limited to projects runs "
                                 f"{', '.join(sorted(_TENANT_WIDE | set(_project_names(svc))))}")
    else:
        require(p, "admin")
    if query is not None:
        return await reads.run_read(query, params)
    assert name is not None
    return await reads.run_named(name, params)


def _scoped_names(svc: LiveService) -> list[str]:
    return [q.name for q in svc.reads.inspection_queries() if "tenant_id" in q.params]


def _project_names(svc: LiveService) -> list[str]:
    return [q.name for q in svc.reads.inspection_queries() if "projects" in q.params]
