"""Roles and what each may do: the one table the API's route dependencies read.

A key has exactly one role. ``admin`` (the platform admin: ``SLICESCHED_ADMIN_KEY``), ``auditor``
(reads the whole audit log, nothing else) and ``executor`` (one identity per executor pool) are
the platform's; ``tenant_admin``, ``member`` and ``viewer`` belong to one tenant. A tenant's own
key (the one it is created or onboarded with) is its first ``tenant_admin`` key. A member or
viewer key may be limited to some of its tenant's projects; a tenant admin's covers them all.

The route-by-role matrix in docs/API.md is this table applied to each route; the test
tests/api/test_role_matrix.py calls every route with every role.
"""

from __future__ import annotations

ADMIN = "admin"
TENANT_ADMIN = "tenant_admin"
MEMBER = "member"
VIEWER = "viewer"
AUDITOR = "auditor"
EXECUTOR = "executor"

ROLES = (ADMIN, TENANT_ADMIN, MEMBER, VIEWER, AUDITOR, EXECUTOR)
TENANT_ROLES = (TENANT_ADMIN, MEMBER, VIEWER)

#: What a route may need, and the roles that have it.
SUBMIT = (ADMIN, TENANT_ADMIN, MEMBER)  # submit and cancel work
READ = (ADMIN, TENANT_ADMIN, MEMBER, VIEWER)  # read a tenant's requests, models, projects, usage
MANAGE = (ADMIN, TENANT_ADMIN)  # a tenant's keys, projects, models and access requests
AUDIT_READ = (ADMIN, AUDITOR, TENANT_ADMIN)  # the audit log (a tenant admin: its own tenant's entries)
AUDIT_VERIFY = (ADMIN, AUDITOR)  # the whole chain's verification
EXECUTE = (ADMIN, EXECUTOR)  # register executors, lease and report work
PLATFORM = (ADMIN,)  # tenants, pools, devices, metrics, what-ifs, approvals

#: Roles a tenant admin may give a key of its tenant; the platform admin may also give ``auditor``
#: keys (which belong to no tenant).
TENANT_KEY_ROLES = TENANT_ROLES


def is_tenant_role(role: str) -> bool:
    return role in TENANT_ROLES
