"""Who may call: the keys of people and services within tenants (with a role, an expiry,
rotation and revocation), the platform's auditor keys, and the projects inside each tenant.

Every key lives in Neo4j as an ``ApiKey`` node holding only its SHA-256 (``(Tenant)-[:HAS_KEY]->``
for a tenant's keys); a project is a ``Project`` node (``(Tenant)-[:HAS_PROJECT]->``) with its
quota. Each change is persisted before the in-memory index changes, so a revoked key is refused
at once and stays refused after a restart; an expired key is refused from the second its expiry
passes (checked at every call, no sweep needed). A tenant's own key (created with the tenant)
stays on the ``Tenant`` node and acts as its first ``tenant_admin`` key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.domain.error import ConflictError, ForbiddenError, InvalidInputError, NotFoundError, UnauthorizedError
from service.domain.quota import Quota
from service.domain.role import AUDITOR, TENANT_ROLES

DEFAULT_PROJECT = "default"  # every tenant has it; work that names no project belongs to it
MAX_KEYS_PER_TENANT = 1000
MAX_PROJECTS_PER_TENANT = 1000


@dataclass
class ApiKeyRecord:
    key_id: str
    tenant_id: str | None  # None: a platform key (auditor)
    name: str  # the person or service it belongs to
    role: str
    projects: tuple[str, ...]  # the projects it acts in; () every project of its tenant
    key_hash: str | None  # None: revoked
    expires_at: float | None  # epoch seconds; None: never
    created_at: float
    created_by: str

    def status(self, now: float) -> str:
        if self.key_hash is None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def public(self, now: float) -> dict[str, Any]:
        return {"key_id": self.key_id, "tenant_id": self.tenant_id, "name": self.name, "role": self.role,
                "projects": list(self.projects), "expires_at": self.expires_at, "created_at": self.created_at,
                "created_by": self.created_by, "status": self.status(now)}

    def row(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "tenant_id": self.tenant_id, "name": self.name, "role": self.role,
                "projects": list(self.projects), "key_hash": self.key_hash, "expires_at": self.expires_at,
                "created_at": self.created_at, "created_by": self.created_by}

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> ApiKeyRecord:
        return cls(r["key_id"], r.get("tenant_id"), r["name"], r["role"], tuple(r.get("projects") or ()),
                   r.get("key_hash"), r.get("expires_at"), float(r["created_at"]), r.get("created_by") or "")


@dataclass
class LiveProject:
    tenant_id: str
    project_id: str
    quota: Quota = field(default_factory=Quota)
    description: str = ""
    created_at: float = 0.0

    @property
    def uid(self) -> str:
        return f"{self.tenant_id}/{self.project_id}"


class AccessBook:
    """The keys by id and by hash, the projects, and each tenant's quota (in memory; Neo4j is
    the record: :meth:`recover` rebuilds it)."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str | None, str], ApiKeyRecord] = {}  # (tenant or None, key id)
        self.by_hash: dict[str, tuple[str | None, str]] = {}
        self.projects: dict[tuple[str, str], LiveProject] = {}
        self.tenant_quota: dict[str, Quota] = {}

    # ---- keys ---------------------------------------------------------------------------------
    def add_key(self, key: ApiKeyRecord) -> None:
        ident = (key.tenant_id, key.key_id)
        old = self.keys.get(ident)
        if old is not None and old.key_hash is not None:
            self.by_hash.pop(old.key_hash, None)
        self.keys[ident] = key
        if key.key_hash is not None:
            self.by_hash[key.key_hash] = ident

    def key_of_hash(self, key_hash: str, now: float) -> ApiKeyRecord | None:
        """The key with this hash; an expired one is a 401 that says so."""
        ident = self.by_hash.get(key_hash)
        if ident is None:
            return None
        key = self.keys[ident]
        if key.status(now) == "expired":
            raise UnauthorizedError(f"key {key.key_id!r} expired; ask your tenant admin for a new one")
        return key

    def key(self, tenant_id: str | None, key_id: str) -> ApiKeyRecord:
        found = self.keys.get((tenant_id, key_id))
        if found is None:
            raise NotFoundError(f"no key {key_id!r}")
        return found

    def keys_of(self, tenant_id: str | None) -> list[ApiKeyRecord]:
        return sorted((k for k in self.keys.values() if k.tenant_id == tenant_id), key=lambda k: k.key_id)

    def check_new_key(self, tenant_id: str | None, key_id: str, role: str, projects: tuple[str, ...]) -> None:
        if (tenant_id, key_id) in self.keys:
            raise ConflictError(f"key {key_id!r} exists")
        if tenant_id is None:
            if role != AUDITOR:
                raise InvalidInputError(f"a platform key has role auditor, not {role!r}")
            if projects:
                raise InvalidInputError("an auditor key belongs to no tenant and so to no project")
            return
        if role not in TENANT_ROLES:
            raise InvalidInputError(f"a tenant's key has one of the roles {', '.join(TENANT_ROLES)}, not {role!r}")
        if len(self.keys_of(tenant_id)) >= MAX_KEYS_PER_TENANT:
            raise ConflictError(f"tenant {tenant_id!r} has {MAX_KEYS_PER_TENANT} keys: revoke some first")
        for p in projects:
            self.project(tenant_id, p)

    # ---- projects -----------------------------------------------------------------------------
    def add_project(self, project: LiveProject) -> None:
        self.projects[(project.tenant_id, project.project_id)] = project

    def project(self, tenant_id: str, project_id: str) -> LiveProject:
        found = self.projects.get((tenant_id, project_id))
        if found is None:
            if project_id == DEFAULT_PROJECT:  # implied until written (tenants from before projects)
                found = LiveProject(tenant_id, DEFAULT_PROJECT)
                self.projects[(tenant_id, DEFAULT_PROJECT)] = found
                return found
            raise NotFoundError(f"no project {project_id!r}")
        return found

    def projects_of(self, tenant_id: str) -> list[LiveProject]:
        self.project(tenant_id, DEFAULT_PROJECT)
        return sorted((p for p in self.projects.values() if p.tenant_id == tenant_id), key=lambda p: p.project_id)

    def check_new_project(self, tenant_id: str, project_id: str) -> None:
        if (tenant_id, project_id) in self.projects or project_id == DEFAULT_PROJECT:
            raise ConflictError(f"project {project_id!r} exists")
        if len(self.projects_of(tenant_id)) >= MAX_PROJECTS_PER_TENANT:
            raise ConflictError(f"tenant {tenant_id!r} has {MAX_PROJECTS_PER_TENANT} projects")

    def quota_of(self, tenant_id: str) -> Quota:
        return self.tenant_quota.get(tenant_id, Quota())

    # ---- which project a call acts in -----------------------------------------------------------
    @staticmethod
    def project_for(projects: tuple[str, ...], asked: str | None) -> str:
        """The project a key's call acts in: the one asked, if the key may act there; a key of
        one project acts there by default; any other key in ``default``. A project the key does
        not cover is a 403."""
        if asked is None:
            return projects[0] if len(projects) == 1 else DEFAULT_PROJECT
        if projects and asked not in projects:
            raise ForbiddenError(f"this key acts in the projects {', '.join(projects)}, not {asked!r}")
        return asked
