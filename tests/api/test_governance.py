"""Governance on the real service and Neo4j: onboarding with approval, keys of people and
services (roles, projects, expiry, rotation, revocation), projects, quotas the admission
enforces (429 with Retry-After) and usage in the API and the GMG."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import ADMIN, FrozenWall, auth, new_tenant


def _onboard(client: TestClient, tenant_id: str, **extra: Any) -> dict[str, Any]:
    body = {"tenant_id": tenant_id, "organisation": "Acme Ltd", "contact": "ops@acme.test",
            "sla_class": "interactive", "models": [{"model_id": "chat", "family": "tiny"}],
            "quota": {"tokens_per_s": 50.0}, **extra}
    r = client.post("/v1/onboarding", json=body)
    assert r.status_code == 202, r.text
    return dict(r.json())


def test_onboarding_needs_approval_before_any_key_and_keeps_its_history(make_client: Callable[..., TestClient],
                                                                       uid: str) -> None:
    client = make_client()
    sub = _onboard(client, f"a{uid}")
    rid, token = sub["request_id"], sub["claim_token"]
    assert sub["status"] == "pending"
    # nothing exists before approval: no tenant, no key
    assert client.get(f"/v1/tenants/a{uid}", headers=auth(ADMIN)).status_code == 404
    claim = client.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": token}).json()
    assert claim["status"] == "pending" and claim["api_key"] is None
    assert client.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": "wrong"}).status_code == 404
    # the same id cannot be asked for twice while pending
    assert client.post("/v1/onboarding", json={"tenant_id": f"a{uid}", "organisation": "x",
                                                "contact": "x@y.z"}).status_code == 409
    queue = client.get("/v1/access-requests", params={"status": "pending"}, headers=auth(ADMIN)).json()
    assert rid in [q["request_id"] for q in queue]
    # only the platform admin decides
    other = new_tenant(client, f"o{uid}")
    assert client.post(f"/v1/access-requests/{rid}/approve", json={"reason": "me"},
                       headers=auth(other)).status_code == 403
    r = client.post(f"/v1/access-requests/{rid}/approve", json={"reason": "known customer"}, headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "approved" and r.json()["reason"] == "known customer"
    t = client.get(f"/v1/tenants/a{uid}", headers=auth(ADMIN)).json()
    assert t["sla_class"] == "interactive" and t["models"] == ["chat"]
    # the claim token gets the first key, once
    key = client.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": token}).json()["api_key"]
    assert key is not None
    assert client.get("/v1/whoami", headers=auth(key)).json()["role"] == "tenant_admin"
    again = client.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": token}).json()
    assert again["api_key"] is None and again["claimed"] is True
    assert [h["action"] for h in again["history"]] == ["submitted", "approved", "claimed"]
    assert client.get(f"/v1/tenants/a{uid}/usage", headers=auth(key)).json()["tenant"]["quota"]["tokens_per_s"] == 50
    # a rejection says why; a decided request cannot be decided again
    rej = _onboard(client, f"r{uid}")
    r = client.post(f"/v1/access-requests/{rej['request_id']}/reject", json={"reason": "unknown organisation"},
                    headers=auth(ADMIN))
    assert r.json()["status"] == "rejected"
    assert client.post(f"/v1/access-requests/{rej['request_id']}/approve", json={"reason": "x"},
                       headers=auth(ADMIN)).status_code == 409
    seen = client.post(f"/v1/onboarding/{rej['request_id']}/claim", json={"claim_token": rej["claim_token"]}).json()
    assert seen["status"] == "rejected" and seen["reason"] == "unknown organisation" and seen["api_key"] is None
    assert client.get(f"/v1/tenants/r{uid}", headers=auth(ADMIN)).status_code == 404
    # a restart keeps requests, decisions and the claimed key
    restarted = make_client()
    assert restarted.get("/v1/whoami", headers=auth(key)).status_code == 200
    hist = restarted.get(f"/v1/access-requests/{rid}", headers=auth(ADMIN)).json()["history"]
    assert [h["action"] for h in hist] == ["submitted", "approved", "claimed"]


def test_later_requests_go_through_the_same_approval(client: TestClient, uid: str) -> None:
    key = new_tenant(client, f"t{uid}")
    quota = client.post("/v1/access-requests", json={"kind": "quota", "quota": {"tokens_per_s": 500.0},
                                                      "note": "launch"}, headers=auth(key))
    assert quota.status_code == 201, quota.text
    model = client.post("/v1/access-requests", json={"kind": "model", "model_id": "big", "family": "tiny"},
                        headers=auth(key)).json()
    sla = client.post("/v1/access-requests", json={"kind": "sla_class", "sla_class": "interactive"},
                      headers=auth(key)).json()
    assert client.post("/v1/access-requests", json={"kind": "model", "model_id": "x"},
                       headers=auth(key)).status_code == 400  # no family: a clear 400, nothing written
    mine = client.get("/v1/access-requests", headers=auth(key)).json()
    assert {m["kind"] for m in mine} == {"quota", "model", "sla_class"}
    for rid in (quota.json()["request_id"], model["request_id"], sla["request_id"]):
        r = client.post(f"/v1/access-requests/{rid}/approve", json={"reason": "ok"}, headers=auth(ADMIN))
        assert r.status_code == 200, r.text
    t = client.get(f"/v1/tenants/t{uid}", headers=auth(key)).json()
    assert t["sla_class"] == "interactive" and t["models"] == ["big"]
    usage = client.get(f"/v1/tenants/t{uid}/usage", headers=auth(key)).json()
    assert usage["tenant"]["quota"]["tokens_per_s"] == 500.0
    # a memory quota bounds the weights its models hold
    assert client.put(f"/v1/tenants/t{uid}/quota", json={"mem_bytes": 2**20}, headers=auth(ADMIN)).status_code == 200
    r = client.post("/v1/catalog/models", json={"model_id": "more", "family": "tiny"}, headers=auth(key))
    assert r.status_code == 409 and "memory quota" in r.json()["error"]["message"]
    # another tenant sees none of it
    other = new_tenant(client, f"o{uid}")
    assert client.get("/v1/access-requests", headers=auth(other)).json() == []
    assert client.get(f"/v1/access-requests/{model['request_id']}", headers=auth(other)).status_code == 404


def test_keys_have_roles_projects_expiry_rotation_and_revocation(make_client: Callable[..., TestClient],
                                                                uid: str) -> None:
    client = make_client()
    t = f"t{uid}"
    owner = new_tenant(client, t)
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(owner)).status_code == 201
    assert client.post(f"/v1/tenants/{t}/projects", json={"project_id": "research"},
                       headers=auth(owner)).status_code == 201

    def make_key(key_id: str, role: str, **extra: Any) -> str:
        r = client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": key_id, "name": key_id, "role": role, **extra},
                        headers=auth(owner))
        assert r.status_code == 201, r.text
        return str(r.json()["api_key"])

    wall = FrozenWall(client)
    member = make_key("ann", "member", projects=["research"])
    viewer = make_key("bob", "viewer")
    short = make_key("tmp", "member", expires_in_s=1.0)
    # a member submits in its project, not in another; a viewer reads but cannot submit
    body = {"model_id": "m", "prompt": "hi", "max_tokens": 2}
    r = client.post("/v1/requests", json=body, headers=auth(member))
    assert r.status_code == 202, r.text
    rid = r.json()["request_id"]
    assert client.get(f"/v1/requests/{rid}", headers=auth(member)).json()["project_id"] == "research"
    assert client.post("/v1/requests", json={**body, "project_id": "default"}, headers=auth(member)).status_code == 403
    assert client.post("/v1/requests", json=body, headers=auth(viewer)).status_code == 403
    assert client.get(f"/v1/requests/{rid}", headers=auth(viewer)).status_code == 200
    assert client.post(f"/v1/requests/{rid}/cancel", headers=auth(viewer)).status_code == 403
    owner_req = client.post("/v1/requests", json=body, headers=auth(owner)).json()["request_id"]
    assert client.get(f"/v1/requests/{owner_req}", headers=auth(member)).status_code == 404  # not its project
    assert client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": "x", "name": "x", "role": "member"},
                       headers=auth(member)).status_code == 403  # only tenant admins manage keys
    # an expired key is refused the moment it expires (on the service's clock)
    wall.advance(0.9)
    assert client.get("/v1/whoami", headers=auth(short)).status_code == 200
    wall.advance(0.2)
    r = client.get("/v1/whoami", headers=auth(short))
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    # rotation: the old secret is refused at once, the new one works
    r = client.post(f"/v1/tenants/{t}/api-keys/bob/rotate", headers=auth(owner))
    new_viewer = r.json()["api_key"]
    assert client.get("/v1/whoami", headers=auth(viewer)).status_code == 401
    assert client.get("/v1/whoami", headers=auth(new_viewer)).json() == {
        "role": "viewer", "tenant_id": t, "key_id": "bob", "projects": []}
    # revocation: at once, and after a restart; another tenant cannot touch these keys
    other = new_tenant(client, f"o{uid}")
    assert client.post(f"/v1/tenants/{t}/api-keys/ann/revoke", headers=auth(other)).status_code == 404
    assert client.get(f"/v1/tenants/{t}/api-keys", headers=auth(other)).status_code == 404
    assert client.post(f"/v1/tenants/{t}/api-keys/ann/revoke", headers=auth(owner)).json()["status"] == "revoked"
    assert client.get("/v1/whoami", headers=auth(member)).status_code == 401
    listed = {k["key_id"]: k["status"] for k in client.get(f"/v1/tenants/{t}/api-keys", headers=auth(owner)).json()}
    assert listed == {"ann": "revoked", "bob": "active", "tmp": "expired"}
    restarted = make_client()
    FrozenWall(restarted).now = wall.now  # the same clock after the restart: past the short key's expiry
    assert restarted.get("/v1/whoami", headers=auth(member)).status_code == 401
    assert restarted.get("/v1/whoami", headers=auth(short)).status_code == 401
    assert restarted.get("/v1/whoami", headers=auth(new_viewer)).status_code == 200
    # auditors: platform keys that read the audit log and nothing else
    r = restarted.post("/v1/auditor-keys", json={"key_id": f"aud{uid}", "name": "auditor"}, headers=auth(ADMIN))
    auditor = r.json()["api_key"]
    assert restarted.get("/v1/audit", params={"limit": 5}, headers=auth(auditor)).status_code == 200
    assert restarted.get("/v1/audit/verify", headers=auth(auditor)).status_code == 200
    assert restarted.get(f"/v1/requests/{rid}", headers=auth(auditor)).status_code == 403
    assert restarted.post("/v1/requests", json=body, headers=auth(auditor)).status_code == 403


def test_quotas_refuse_with_retry_after_and_do_not_touch_a_tenant_within_its_own(
        make_client: Callable[..., TestClient], uid: str, repo: Any) -> None:
    client = make_client(usage_interval_s=0.2)
    FrozenWall(client)  # no bucket refills between the calls, however long they take
    busy, calm = new_tenant(client, f"b{uid}"), new_tenant(client, f"c{uid}")
    for key in (busy, calm):
        assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key)).status_code == 201
    # 5 tokens/s holds a 50-token burst: each request costs prompt (2) + max_tokens (8) = 10 tokens
    assert client.put(f"/v1/tenants/b{uid}/quota", json={"tokens_per_s": 5.0}, headers=auth(ADMIN)).status_code == 200
    assert client.put(f"/v1/tenants/b{uid}/quota", json={"tokens_per_s": 5.0}, headers=auth(busy)).status_code == 403
    body = {"model_id": "m", "prompt": "hi", "max_tokens": 8}
    codes = [client.post("/v1/requests", json=body, headers=auth(busy)) for _ in range(8)]
    accepted = [r for r in codes if r.status_code == 202]
    refused = [r for r in codes if r.status_code == 429]
    assert len(accepted) == 5 and len(refused) == 3
    assert refused[0].json()["error"]["kind"] == "quota_exceeded"
    assert 1 <= int(refused[0].headers["Retry-After"]) <= 3
    # a request larger than the bucket holds is refused for good, with a message that says so
    big = client.post("/v1/requests", json={**body, "max_tokens": 100}, headers=auth(busy))
    assert big.status_code == 429 and "never" in big.json()["error"]["message"]
    # the tenant within its quota: every request accepted; the over-quota flood never reached a queue
    assert all(client.post("/v1/requests", json=body, headers=auth(calm)).status_code == 202 for _ in range(20))
    queued = client.get("/v1/requests", params={"limit": 1000}, headers=auth(busy)).json()
    assert len(queued) == 5
    # a project's own quota binds within the tenant's
    assert client.post(f"/v1/tenants/c{uid}/projects", json={"project_id": "lab", "quota": {"tokens_per_s": 1.0}},
                       headers=auth(calm)).status_code == 201
    lab = [client.post("/v1/requests", json={**body, "project_id": "lab"}, headers=auth(calm)).status_code
           for _ in range(2)]
    assert lab == [202, 429]
    usage = client.get(f"/v1/tenants/c{uid}/usage", headers=auth(calm)).json()
    assert usage["tenant"]["tokens_admitted"] == 21 * 10 and usage["projects"]["lab"]["tokens_admitted"] == 10
    assert usage["projects"]["lab"]["requests_refused"] == 1
    # the batch is all or nothing: no token is charged for a refused batch
    before = client.get(f"/v1/tenants/b{uid}/usage", headers=auth(busy)).json()["tenant"]["tokens_admitted"]
    r = client.post("/v1/requests/batch", json={"requests": [body, body]}, headers=auth(busy))
    assert r.status_code == 429
    assert client.get(f"/v1/tenants/b{uid}/usage", headers=auth(busy)).json()["tenant"]["tokens_admitted"] == before
    # usage lands in the GMG (the usage loop writes it onto Tenant and Project nodes)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with repo.driver.session() as s:
            row = s.run("MATCH (t:Tenant {tenant_id: $t})-[:HAS_PROJECT]->(p:Project {project_id: 'lab'}) "
                        "RETURN t.usage_tokens_used AS t, p.usage_requests_refused AS refused",
                        t=f"c{uid}").single()
        if row is not None and row["t"] == 210 and row["refused"] == 1:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"usage not in the GMG: {row}")
