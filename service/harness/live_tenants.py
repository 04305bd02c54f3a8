"""Setting up a live run's tenants: creating them with their models on a live stack, and
clearing what earlier runs left of them in a shared graph (the demo, its capacity probe and
the live benchmarks all start this way)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from service.workload.synthetic import TenantLoad


def register(stack: LiveStack, loads: Sequence[TenantLoad], weights: Mapping[str, float] | None = None
             ) -> dict[str, str]:
    """Create each tenant (its SLA class and its ``weights`` entry, default 1: container placement
    sizes homes by it) and its model ``m``; returns the tenants' keys."""
    keys: dict[str, str] = {}
    with stack.client(timeout_s=120.0) as admin:
        for load in sorted(loads, key=lambda t: t.tenant_id):
            weight = (weights or {}).get(load.tenant_id, 1.0)
            r = admin.post("/v1/tenants", json={"tenant_id": load.tenant_id, "sla_class": load.sla_class,
                                                "weight": weight})
            if r.status_code == 409:
                raise RuntimeError(f"tenant {load.tenant_id} already exists in this Neo4j: use a clean graph")
            r.raise_for_status()
            keys[load.tenant_id] = r.json()["api_key"]
            admin.post("/v1/catalog/models", json={"model_id": "m", "family": load.model, "tenant_id": load.tenant_id}
                       ).raise_for_status()
    return keys


def reset_tenants(neo4j: Neo4jSettings, tenant_ids: Sequence[str]) -> None:
    """Delete everything these tenants own in the graph (models, requests, slices, keys)."""
    from service.graph.connection import open_driver
    from service.graph.repository import GraphRepository

    with open_driver(neo4j) as driver:
        repo = GraphRepository(driver)
        for tenant in tenant_ids:
            repo.models.delete_tenant(tenant)
