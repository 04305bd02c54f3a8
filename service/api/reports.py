"""What the API reports: the public form of tenants, models, devices and requests; the admin's
stats (write-lag percentiles, counters, recent decisions); what-if predictions; Cypher inspection
(raw for admins, named and scoped to themselves for tenants)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.domain.error import ForbiddenError, InvalidInputError, NotFoundError
from service.domain.principal import Principal, require, scoped_tenant
from service.domain.tokenizer import BYTES, Tokenizer
from service.graph.inspection import Table
from service.live.records import LiveModel, LiveRequest

if TYPE_CHECKING:
    from service.live.service import LiveService


def tenant_public(svc: LiveService, tenant_id: str) -> dict[str, Any]:
    t = svc.state.tenant(tenant_id)
    return {"tenant_id": t.tenant_id, "sla_class": t.sla_class, "weight": t.weight, "priority": t.priority,
            "models": sorted(m.model_id for m in svc.state.models.values() if m.tenant_id == tenant_id),
            "key": "active" if t.key_hash is not None else "revoked"}


def model_public(m: LiveModel) -> dict[str, Any]:
    c = m.config
    return {"tenant_id": m.tenant_id, "model_id": m.model_id, "family": m.family, "seed": m.seed,
            "replicas": m.replicas, "num_params": c.num_params(), "weight_bytes": m.weight_bytes,
            "max_context": c.max_seq_len, "vocab_size": c.vocab_size, "path": m.path}


def devices_public(svc: LiveService) -> list[dict[str, Any]]:
    s = svc.state
    return [{"device_id": d.device_id, "executor_id": d.executor_id, "host_id": d.host_id, "kind": d.kind,
             "mem_bytes": d.mem_bytes, "free_bytes": s.free_bytes(d.device_id),
             "replicas": sorted(r.replica_id for r in s.replicas.values() if d.device_id in r.device_ids)}
            for d in sorted(s.devices.values(), key=lambda d: d.device_id)]


def request_public(svc: LiveService, req: LiveRequest) -> dict[str, Any]:
    """The request as its tenant sees it; ``text``: the output decoded by its model's tokenizer."""
    model = svc.state.models.get(req.model_uid)
    tokenizer: Tokenizer = model.tokenizer if model is not None else BYTES
    return {**req.public(), "text": tokenizer.decode(req.output_tokens)}


def accepted_public(req: LiveRequest) -> dict[str, Any]:
    return {"request_id": req.request_id, "status": req.status, "token_budget": req.token_budget,
            "prompt_tokens": len(req.prompt)}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (nearest rank, no interpolation); None when empty."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def stats(svc: LiveService) -> dict[str, Any]:
    """Counters, GMG write lag and the scheduler's recent decisions."""
    writer = svc.writer
    lags = sorted(writer.lags_s) if writer else []
    errors = svc.state.calibrator.abs_errors
    return {"counters": dict(svc.state.counters),
            "gmg_write_lag_s": {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99),
                                "rows": writer.rows_written if writer else 0,
                                "pending": writer.pending if writer else 0},
            "replicas": [{"replica_id": r.replica_id, "model": r.model_uid, "devices": list(r.device_ids),
                          "guest": r.guest, "draining": r.draining, "leases": len(r.leases)}
                         for r in svc.state.replicas.values()],
            "decisions": svc.decisions[-50:], "iteration_s": svc.state.iteration_s,
            "queue_policy": svc.state.policy.name,
            "unplaced_models": dict(svc.unplaced), "loops": svc.supervisor.report(),
            "scheduler_steps": len(svc.step_s), "scheduler_step_s_total": sum(svc.step_s),
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
    svc.state.model(tenant_id, model_id)
    outcome: dict[str, Any] = await svc.in_thread(svc.what_if, f"{tenant_id}/{model_id}", tuple(device_ids), horizon_s)
    return outcome


async def inspect(svc: LiveService, p: Principal, query: str | None, name: str | None,
                  params: dict[str, Any]) -> Table:
    """Read-only Cypher (admin) or a named query; a tenant key runs named queries scoped to itself."""
    assert svc.repo is not None
    repo = svc.repo
    if (query is None) == (name is None):
        raise InvalidInputError("give exactly one of query (Cypher) and name (a named query)")
    params = dict(params)
    if p.is_tenant:
        if query is not None:
            raise ForbiddenError("tenant keys run named queries (raw Cypher is for admin keys)")
        assert name is not None
        q = repo.catalog.get(name)
        if q.category != "inspect" or "tenant_id" not in q.params:
            raise NotFoundError(f"no tenant-scoped query {name!r} (yours: {', '.join(_scoped_names(svc))})")
        params["tenant_id"] = scoped_tenant(p, params.get("tenant_id"))
    else:
        require(p, "admin")
    if query is not None:
        table: Table = await svc.db(repo.run_read, query, params, bound_s=30.0)
    else:
        assert name is not None
        table = await svc.db(repo.run_named, name, params, bound_s=30.0)
    return table


def _scoped_names(svc: LiveService) -> list[str]:
    assert svc.repo is not None
    return [q.name for q in svc.repo.inspection_queries() if "tenant_id" in q.params]
