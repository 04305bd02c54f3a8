"""Governance records in the GMG: API keys (hashes only), projects with their quotas, access
requests (onboarding and later changes) with their history, and quota usage."""

from __future__ import annotations

from typing import Any

from service.domain.error import NotFoundError
from service.graph.store import StorePart, check_id


class GovernanceStore(StorePart):
    QUERIES: tuple[str, ...] = ("upsert_api_key", "live_api_keys", "upsert_project", "live_projects", "record_usage",
                                "upsert_access_request", "access_requests")

    def upsert_api_key(self, tenant_id: str | None, key_id: str, **props: Any) -> None:
        """A tenant's key (``tenant_id`` None: a platform auditor key), its hash only."""
        uid = f"{check_id('tenant', tenant_id) if tenant_id is not None else 'platform'}/{check_id('key', key_id)}"
        self._write("upsert_api_key", uid=uid, props={"key_id": key_id, "tenant_id": tenant_id, **props})

    def live_api_keys(self) -> list[dict[str, Any]]:
        return self._read("live_api_keys")

    def upsert_project(self, tenant_id: str, project_id: str, **props: Any) -> None:
        """A project of an existing tenant (:class:`NotFoundError` for none)."""
        uid = f"{check_id('tenant', tenant_id)}/{check_id('project', project_id)}"
        if not self._write("upsert_project", uid=uid, tenant_id=tenant_id, props={"project_id": project_id, **props}):
            raise NotFoundError(f"no tenant {tenant_id!r}")

    def live_projects(self) -> list[dict[str, Any]]:
        return self._read("live_projects")

    def record_usage(self, rows: list[dict[str, Any]]) -> int:
        out = self._write("record_usage", rows=rows)
        return int(out[0]["written"]) if out else 0

    def upsert_access_request(self, uid: str, **props: Any) -> None:
        self._write("upsert_access_request", uid=check_id("access request", uid), props=props)

    def access_requests(self) -> list[dict[str, Any]]:
        return self._read("access_requests")
