"""Who is calling: a key's role, its tenant, pool and projects, and the checks every layer makes
on it (the HTTP layer authenticates a key into a :class:`Principal`; the live service decides
with it)."""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.error import ForbiddenError, InvalidInputError, NotFoundError
from service.domain.role import ADMIN, is_tenant_role


@dataclass(frozen=True)
class Principal:
    role: str  # one of service.domain.role.ROLES
    tenant_id: str | None = None
    pool_id: str | None = None  # an executor key's pool
    key_id: str | None = None  # a member key's id (None: the admin key, a tenant's own key, a pool key)
    projects: tuple[str, ...] = ()  # the projects a member or viewer key is limited to (): all

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN

    @property
    def is_tenant(self) -> bool:
        """A key of one tenant (tenant admin, member or viewer)."""
        return is_tenant_role(self.role)


def require(p: Principal, *roles: str) -> None:
    if p.role not in roles:
        raise ForbiddenError(f"this needs a key of role {' or '.join(roles)} (yours: {p.role})")


def scoped_tenant(p: Principal, given: str | None) -> str:
    """The tenant a call acts for: a tenant key's own, or the admin's explicit choice."""
    if p.is_tenant:
        assert p.tenant_id is not None
        if given is not None and given != p.tenant_id:
            raise NotFoundError(f"no tenant {given!r}")
        return p.tenant_id
    require(p, ADMIN)
    if given is None:
        raise InvalidInputError("admin keys must name the tenant_id")
    return given


def scoped_projects(p: Principal, given: object) -> list[str] | None:
    """The projects a tenant-scoped read covers: ``given`` (a list of project ids, or None for all),
    narrowed to a key's projects when the key is limited to some (then None means its projects, and
    a project outside them is a 403, as submitting in it is)."""
    if given is not None and (not isinstance(given, list) or not all(isinstance(x, str) for x in given)):
        raise InvalidInputError("projects must be a list of project ids, or null for all")
    if not p.projects:
        return given
    if given is None:
        return list(p.projects)
    outside = sorted(set(given) - set(p.projects))
    if outside:
        raise ForbiddenError(f"this key is limited to projects {list(p.projects)} (not {outside})")
    return given


def own_tenant(p: Principal, tenant_id: str) -> None:
    """Admin keys act for any tenant; a tenant's key for its own only (any other is a 404)."""
    if p.is_tenant:
        if p.tenant_id != tenant_id:
            raise NotFoundError(f"no tenant {tenant_id!r}")
        return
    require(p, ADMIN)
