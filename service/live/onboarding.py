"""Access requests: onboarding a new tenant, and the changes an existing tenant asks for (a
quota increase, a new model, a higher SLA class), each decided by a platform admin.

A prospective tenant submits an onboarding request without a key and gets a **claim token**
(shown once; Neo4j keeps its SHA-256). Until an admin approves, nothing exists but the request:
no tenant, no key. Approval creates the tenant with its quota, its SLA class and the models it
asked for; the tenant's first key (``tenant_admin``) is issued to whoever presents the claim
token, once. A rejection says why. A tenant admin asks for later changes with its key; approval
applies them. Every request keeps its whole history (who, when, what, why) as an
``AccessRequest`` node, and every decision is in the audit log.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from service.domain.error import ConflictError, NotFoundError
from service.domain.quota import Quota

KINDS = ("onboarding", "quota", "model", "sla_class")
PENDING, APPROVED, REJECTED = "pending", "approved", "rejected"


@dataclass
class AccessRequest:
    uid: str
    kind: str
    tenant_id: str
    payload: dict[str, Any]  # what is asked for (kind-specific; never a secret)
    status: str = PENDING
    history: list[dict[str, Any]] = field(default_factory=list)  # {at, by, action, reason?}
    claim_hash: str | None = None  # onboarding: SHA-256 of the claim token
    claimed: bool = False  # onboarding: the first key was issued
    created_at: float = field(default_factory=time.time)
    decided_at: float | None = None
    project_id: str | None = None  # a quota request for one project (None: the tenant's)

    def note(self, by: str, action: str, reason: str | None = None, at: float | None = None) -> None:
        entry: dict[str, Any] = {"at": time.time() if at is None else at, "by": by, "action": action}
        if reason:
            entry["reason"] = reason
        self.history.append(entry)

    @property
    def reason(self) -> str | None:
        decided = [h for h in self.history if h["action"] in (APPROVED, REJECTED)]
        return decided[-1].get("reason") if decided else None

    def public(self) -> dict[str, Any]:
        return {"request_id": self.uid, "kind": self.kind, "tenant_id": self.tenant_id,
                "project_id": self.project_id, "status": self.status, "payload": self.payload,
                "reason": self.reason, "history": list(self.history), "created_at": self.created_at,
                "decided_at": self.decided_at, "claimed": self.claimed if self.kind == "onboarding" else None}

    def props(self) -> dict[str, Any]:
        """Its GMG properties."""
        return {"kind": self.kind, "tenant_id": self.tenant_id, "project_id": self.project_id, "status": self.status,
                "payload_json": json.dumps(self.payload, sort_keys=True),
                "history_json": json.dumps(self.history), "claim_hash": self.claim_hash, "claimed": self.claimed,
                "created_at": self.created_at, "decided_at": self.decided_at}

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> AccessRequest:
        return cls(r["uid"], r["kind"], r["tenant_id"], json.loads(r["payload_json"] or "{}"), r["status"],
                   json.loads(r["history_json"] or "[]"), r.get("claim_hash"), bool(r.get("claimed")),
                   float(r["created_at"]), r.get("decided_at"), r.get("project_id"))

    def quota(self) -> Quota:
        return Quota.from_dict(self.payload.get("quota"))


class AccessRequests:
    """The access requests by id (Neo4j is the record: :meth:`recover`)."""

    def __init__(self) -> None:
        self.requests: dict[str, AccessRequest] = {}

    def recover(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            req = AccessRequest.from_row(r)
            self.requests[req.uid] = req

    @staticmethod
    def new_id() -> str:
        return f"ar-{secrets.token_hex(8)}"

    def get(self, uid: str, tenant_id: str | None = None) -> AccessRequest:
        """The request; with ``tenant_id``, only one of that tenant (others are a 404)."""
        found = self.requests.get(uid)
        if found is None or (tenant_id is not None and (found.tenant_id != tenant_id or found.kind == "onboarding")):
            raise NotFoundError(f"no access request {uid!r}")
        return found

    def pending(self) -> int:
        return sum(1 for r in self.requests.values() if r.status == PENDING)

    def pending_onboarding(self, tenant_id: str) -> AccessRequest | None:
        return next((r for r in self.requests.values()
                     if r.kind == "onboarding" and r.tenant_id == tenant_id and r.status == PENDING), None)

    def listed(self, tenant_id: str | None, status: str | None) -> list[AccessRequest]:
        return sorted((r for r in self.requests.values()
                       if (tenant_id is None or (r.tenant_id == tenant_id and r.kind != "onboarding"))
                       and (status is None or r.status == status)), key=lambda r: (r.created_at, r.uid))

    @staticmethod
    def check_open(req: AccessRequest) -> None:
        if req.status != PENDING:
            raise ConflictError(f"access request {req.uid!r} was {req.status} already")
