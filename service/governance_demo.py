"""The demo's governance step: a newcomer's onboarding with a platform admin's approval, the
first key claimed, a first request served, the audit trail, and the web console in front of
the same API (``slicesched demo`` prints its URL). Real processes on loopback: ``slicesched
serve``, one executor daemon, ``slicesched console``."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx

from service.console import print_table
from service.graph.connection import Neo4jSettings

TENANT = "umbrella"


def governance_demo(neo4j: Neo4jSettings) -> dict[str, Any]:
    """Run the flow; returns what it saw (request ids, the claimed key's role, the console URL)."""
    from service.api.live_tenants import reset_tenants
    from service.api.stack import LiveStack

    reset_tenants(neo4j, [TENANT])  # a demo run before this one left its tenant behind
    with LiveStack(neo4j=neo4j, lease_ttl_s=5.0, heartbeat_s=0.5) as stack:
        stack.start_executor("exec-gov", ["cpu:0"])
        console = stack.start_console()
        print(f"API {stack.url}; web console {console} (for the length of this step; see the end of the demo "
              "to run it yourself)")
        with httpx.Client(base_url=stack.url, timeout=60.0) as anon, stack.client() as admin:
            sent = _ok(anon.post("/v1/onboarding", json={
                "tenant_id": TENANT, "organisation": "Umbrella Corp", "contact": "ops@umbrella.example",
                "sla_class": "standard", "models": [{"model_id": "chat", "family": "tiny"}],
                "quota": {"tokens_per_s": 5000, "device_s_per_hour": 3600}, "note": "the demo's newcomer"}))
            rid, token = sent["request_id"], sent["claim_token"]
            before = _ok(anon.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": token}))
            queue = _ok(admin.get("/v1/access-requests", params={"status": "pending"}))
            decided = _ok(admin.post(f"/v1/access-requests/{rid}/approve", json={"reason": "verified contract"}))
            claimed = _ok(anon.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": token}))
            again = _ok(anon.post(f"/v1/onboarding/{rid}/claim", json={"claim_token": token}))
            key = claimed["api_key"]
            tenant = httpx.Client(base_url=stack.url, timeout=60.0, headers={"Authorization": f"Bearer {key}"})
            with tenant:
                who = _ok(tenant.get("/v1/whoami"))
                stack.wait_devices(1)
                req = _ok(tenant.post("/v1/requests", json={"model_id": "chat", "prompt": "hello, slicesched",
                                                              "max_tokens": 8}))
                done = _wait_done(tenant, req["request_id"])
                usage = _ok(tenant.get(f"/v1/tenants/{TENANT}/usage"))
                audit = _ok(tenant.get("/v1/audit", params={"tenant_id": TENANT}))["entries"]
            seen = _console_sees(console, stack.admin_key, rid)
        print_table(["step", "who", "answer"], [
            ["POST /v1/onboarding", "newcomer (no key)", f"202 {rid} {sent['status']} (claim token shown once)"],
            ["claim", "newcomer", f"{before['status']}; key: {'none yet' if before['api_key'] is None else '?!'}"],
            ["GET /v1/access-requests?status=pending", "platform admin", f"{len(queue)} pending"],
            ["approve", "platform admin", f"{decided['status']}: {decided['reason']}"],
            ["claim", "newcomer", f"{claimed['status']}; first key issued (shown once)"],
            ["claim again", "newcomer", f"key: {'none (issued once)' if again['api_key'] is None else '?!'}"],
            ["GET /v1/whoami", "new key", f"{who['role']} of {who['tenant_id']}"],
            ["POST /v1/requests", "new key", f"{done['status']}: {len(done['output_tokens'])} tokens, "
                                             f"TTFT {done['ttft_s']:.2f}s, text {done['text']!r}"],
            ["GET usage", "new key", f"{usage['tenant']['tokens_used']} tokens used of a 5000 tokens/s quota"],
            ["web console /approvals", "platform admin (signed in by key)",
             "lists the approved request" if seen else "did not list it"],
        ], title="onboarding with approval")
        print_table(["seq", "actor", "action", "target"],
                    [[e["seq"], e["actor"], e["action"], f"{e['target_kind']} {e['target_id'] or ''}"]
                     for e in audit[-8:]], title=f"audit log of {TENANT} (last entries)")
        return {"request_id": rid, "role": who["role"], "console_url": console, "console_saw_approval": seen,
                "first_request": done["status"]}


def _ok(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:300]}")
    return r.json()


def _wait_done(c: httpx.Client, request_id: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = _ok(c.get(f"/v1/requests/{request_id}"))
        if got["status"] in ("done", "failed", "cancelled") or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _console_sees(console: str, admin_key: str, request_id: str) -> bool:
    """Sign in to the console with the admin key (its CSRF token included) and read the queue."""
    with httpx.Client(base_url=console, timeout=30.0, follow_redirects=True) as c:
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/login").text)
        if token is None:
            return False
        c.post("/login", data={"key": admin_key, "csrf": token.group(1)})
        return request_id in c.get("/approvals", params={"status": "approved"}).text
