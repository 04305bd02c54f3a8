"""What tenant admins and the platform admin change about who may do what: keys of people and
services (create, rotate, revoke, with a role, projects and an expiry), projects and their
quotas, tenant quotas, and access requests (onboarding, later changes) and their decisions.
Each change is in Neo4j before memory changes (a revoked key is refused at once, across
restarts) and in the audit log before it is answered. The route-by-role matrix: docs/API.md."""

from __future__ import annotations

import logging
from typing import Any

from service.domain.audit import Actor
from service.domain.error import ConflictError, InvalidInputError, NotFoundError, QueueFullError
from service.domain.principal import Principal
from service.domain.quota import Quota
from service.live.access import AccessBook, ApiKeyRecord, LiveProject
from service.live.audit import AuditLog, actor_of, key_state
from service.live.credential import hash_key, new_key
from service.live.neo4j_gate import Neo4jGate
from service.live.onboarding import APPROVED, PENDING, REJECTED, AccessRequest, AccessRequests
from service.live.registration import Registration, quota_props
from service.live.state import LiveState

log = logging.getLogger("slicesched.service")


def _props(record: ApiKeyRecord) -> dict[str, Any]:
    row = record.row()
    del row["key_id"], row["tenant_id"]
    return row


class Governance:
    """Keys, projects, quotas and access requests (a part of
    :class:`~service.live.service.LiveService`, its parts passed in): ``gate`` to Neo4j, the
    in-memory ``state``, the ``access`` book (keys, projects, quotas), the ``requests`` awaiting a
    decision, the ``audit`` log, ``registration`` (what an approved request creates) and
    ``max_pending`` (access requests awaiting a decision at most)."""

    def __init__(self, gate: Neo4jGate, state: LiveState, access: AccessBook, requests: AccessRequests,
                 audit: AuditLog, registration: Registration, max_pending: int) -> None:
        self.gate, self.state, self.access, self.access_requests = gate, state, access, requests
        self.audit, self.registration, self.max_pending = audit, registration, max_pending

    async def create_key(self, p: Principal, tenant_id: str | None, key_id: str, name: str, role: str,
                         projects: tuple[str, ...], expires_in_s: float | None) -> tuple[ApiKeyRecord, str]:
        """A key for a person or service of ``tenant_id`` (``None``: a platform auditor key); the key
        is returned once, Neo4j keeps its hash."""
        self.access.check_new_key(tenant_id, key_id, role, projects)
        if tenant_id is not None:
            self.state.tenant(tenant_id)
        now = self.state.wall()
        key = new_key(f"{tenant_id or 'platform'}-{key_id}")
        record = ApiKeyRecord(key_id, tenant_id, name, role, projects, hash_key(key),
                              None if expires_in_s is None else now + expires_in_s, now, actor_of(p).actor_id)
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.governance.upsert_api_key, tenant_id, key_id, **_props(record))
        self.access.add_key(record)
        await self.audit.append(actor_of(p), "key.create", "api_key", key_id, tenant_id,
                                after={**record.public(now), **key_state(record.key_hash)})
        return record, key

    async def rotate_key(self, p: Principal, tenant_id: str | None, key_id: str) -> tuple[ApiKeyRecord, str]:
        """A new secret for the key (same id, role, projects and expiry); the old one is refused now."""
        record = self.access.key(tenant_id, key_id)
        if record.key_hash is None:
            raise ConflictError(f"key {key_id!r} is revoked: create a new one")
        before = key_state(record.key_hash)
        key = new_key(f"{tenant_id or 'platform'}-{key_id}")
        rotated = ApiKeyRecord(**{**record.__dict__, "key_hash": hash_key(key)})
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.governance.upsert_api_key, tenant_id, key_id, **_props(rotated))
        self.access.add_key(rotated)
        await self.audit.append(actor_of(p), "key.rotate", "api_key", key_id, tenant_id, before=before,
                                after=key_state(rotated.key_hash))
        return rotated, key

    async def revoke_key(self, p: Principal, tenant_id: str | None, key_id: str) -> ApiKeyRecord:
        record = self.access.key(tenant_id, key_id)
        before = key_state(record.key_hash)
        revoked = ApiKeyRecord(**{**record.__dict__, "key_hash": None})
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.governance.upsert_api_key, tenant_id, key_id, **{**_props(revoked), "revoked_at": self.state.wall()})
        self.access.add_key(revoked)
        await self.audit.append(actor_of(p), "key.revoke", "api_key", key_id, tenant_id, before=before,
                                after=key_state(None))
        return revoked

    async def create_project(self, p: Principal, tenant_id: str, project_id: str, description: str,
                             quota: Quota) -> LiveProject:
        self.state.tenant(tenant_id)
        self.access.check_new_project(tenant_id, project_id)
        project = LiveProject(tenant_id, project_id, quota, description, self.state.wall())
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.governance.upsert_project, tenant_id, project_id, description=description,
                           created_at=project.created_at, **quota_props(quota))
        self.access.add_project(project)
        await self.audit.append(actor_of(p), "project.create", "project", project.uid, tenant_id,
                                after={"description": description, "quota": quota.to_dict()})
        return project

    async def set_project_quota(self, actor: Actor, tenant_id: str, project_id: str, quota: Quota) -> None:
        project = self.access.project(tenant_id, project_id)
        before = project.quota.to_dict()
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.governance.upsert_project, tenant_id, project_id, description=project.description,
                           created_at=project.created_at, **quota_props(quota))
        project.quota = quota
        await self.audit.append(actor, "project.quota", "project", project.uid, tenant_id, before={"quota": before},
                                after={"quota": quota.to_dict()})

    async def set_tenant_quota(self, actor: Actor, tenant_id: str, quota: Quota) -> None:
        self.state.tenant(tenant_id)
        before = self.access.quota_of(tenant_id).to_dict()
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.models.upsert_tenant, tenant_id, **quota_props(quota))
        self.access.tenant_quota[tenant_id] = quota
        await self.audit.append(actor, "tenant.quota", "tenant", tenant_id, tenant_id, before={"quota": before},
                                after={"quota": quota.to_dict()})

    async def _save(self, req: AccessRequest) -> None:
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.governance.upsert_access_request, req.uid, **req.props())

    async def submit_onboarding(self, tenant_id: str, payload: dict[str, Any]) -> tuple[AccessRequest, str]:
        """A prospective tenant's request (no key needed); returns it and its claim token (once)."""
        book = self.access_requests
        if tenant_id in self.state.tenants or book.pending_onboarding(tenant_id) is not None:
            raise ConflictError(f"tenant {tenant_id!r} exists or is awaiting approval: choose another id")
        if book.pending() >= self.max_pending:
            raise QueueFullError("too many access requests await a decision; retry later")
        self.state.check_tenant(payload.get("sla_class") or "standard", 1.0)
        token = new_key(f"claim-{tenant_id}")
        req = AccessRequest(book.new_id(), "onboarding", tenant_id, payload, claim_hash=hash_key(token))
        req.note(payload.get("contact") or tenant_id, "submitted")
        await self._save(req)
        book.requests[req.uid] = req
        await self.audit.append(Actor(payload.get("contact") or tenant_id, "applicant"), "access_request.submit",
                                "access_request", req.uid, after={"kind": req.kind, "tenant_id": tenant_id, **payload})
        return req, token

    async def submit_change(self, p: Principal, tenant_id: str, kind: str, payload: dict[str, Any],
                            project_id: str | None) -> AccessRequest:
        """A tenant's request for a change (quota, model, sla_class), pending a platform admin."""
        self.state.tenant(tenant_id)
        if kind == "sla_class":
            self.state.check_tenant(payload["sla_class"], 1.0)
        if kind == "model":
            self.state.check_new_model(tenant_id, payload["model_id"], payload.get("family"))
        if project_id is not None:
            self.access.project(tenant_id, project_id)
        if self.access_requests.pending() >= self.max_pending:
            raise QueueFullError("too many access requests await a decision; retry later")
        req = AccessRequest(self.access_requests.new_id(), kind, tenant_id, payload, project_id=project_id)
        req.note(actor_of(p).actor_id, "submitted", payload.get("note"))
        await self._save(req)
        self.access_requests.requests[req.uid] = req
        await self.audit.append(actor_of(p), "access_request.submit", "access_request", req.uid, tenant_id,
                                after={"kind": kind, "project_id": project_id, **payload})
        return req

    async def decide(self, p: Principal, uid: str, approve: bool, reason: str) -> AccessRequest:
        """Approve (and apply) or reject a pending request, with a reason; the history keeps it."""
        req = self.access_requests.get(uid)
        self.access_requests.check_open(req)
        actor = actor_of(p)
        if approve:
            await self._apply(actor, req)  # a failure (a model that no longer fits, say) leaves it pending
        req.status = APPROVED if approve else REJECTED
        req.decided_at = self.state.wall()
        req.note(actor.actor_id, req.status, reason, at=req.decided_at)
        try:
            await self._save(req)
        except BaseException:
            if not approve:
                req.status, req.decided_at = PENDING, None
                req.history.pop()
            raise
        await self.audit.append(actor, f"access_request.{'approve' if approve else 'reject'}", "access_request", uid,
                                req.tenant_id if req.tenant_id in self.state.tenants else None,
                                before={"status": PENDING}, after={"status": req.status, "reason": reason})
        return req

    async def _apply(self, actor: Actor, req: AccessRequest) -> None:
        payload = req.payload
        if req.kind == "onboarding":
            await self.registration.create_tenant(actor, req.tenant_id, payload.get("sla_class") or "standard",
                                                  float(payload.get("weight") or 1.0), 0, req.quota(), issue_key=False)
            for m in payload.get("models") or []:
                await self.registration.create_model(actor, req.tenant_id, m["model_id"], m["family"], None, 1)
        elif req.kind == "quota":
            if req.project_id is None:
                await self.set_tenant_quota(actor, req.tenant_id, self.access.quota_of(req.tenant_id).raised_by(req.quota()))
            else:
                project = self.access.project(req.tenant_id, req.project_id)
                await self.set_project_quota(actor, req.tenant_id, req.project_id, project.quota.raised_by(req.quota()))
        elif req.kind == "model":
            await self.registration.create_model(actor, req.tenant_id, payload["model_id"], payload["family"], None,
                                                 int(payload.get("replicas") or 1))
        elif req.kind == "sla_class":
            tenant = self.state.tenant(req.tenant_id)
            before = tenant.sla_class
            assert self.gate.repo is not None
            await self.gate.db(self.gate.repo.models.upsert_tenant, req.tenant_id, sla_class=payload["sla_class"])
            tenant.sla_class = payload["sla_class"]
            await self.audit.append(actor, "tenant.sla_class", "tenant", req.tenant_id, req.tenant_id,
                                    before={"sla_class": before}, after={"sla_class": tenant.sla_class})
        else:  # pragma: no cover - the schema admits only KINDS
            raise InvalidInputError(f"unknown access request kind {req.kind!r}")

    async def claim(self, uid: str, token: str) -> dict[str, Any]:
        """What the holder of an onboarding request's claim token sees: its status and history, and,
        the first time after approval, the tenant's first key (``tenant_admin``)."""
        req = self.access_requests.requests.get(uid)
        if req is None or req.kind != "onboarding" or req.claim_hash is None or req.claim_hash != hash_key(token):
            raise NotFoundError(f"no onboarding request {uid!r} with that claim token")
        out = {**req.public(), "api_key": None}
        if req.status != APPROVED or req.claimed:
            return out
        key = new_key(req.tenant_id)
        assert self.gate.repo is not None
        await self.gate.db(self.gate.repo.live.set_tenant_key, req.tenant_id, hash_key(key))
        req.claimed = True
        req.note(req.payload.get("contact") or req.tenant_id, "claimed")
        try:
            await self._save(req)
        except BaseException:  # the key is in Neo4j: the tenant holds it, whatever the request says
            log.warning("access request %s: claimed, but the claim is not recorded (a second claim would issue a "
                        "second key)", uid)
        self.state.set_tenant_key(req.tenant_id, hash_key(key))
        await self.audit.append(Actor(req.tenant_id, "tenant"), "tenant.key.claim", "tenant", req.tenant_id,
                                req.tenant_id, after=key_state(hash_key(key)), details={"access_request": uid})
        return {**req.public(), "api_key": key}
