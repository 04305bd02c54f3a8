"""The demo's governance step: a newcomer's onboarding with a platform admin's approval, the
first key claimed, a first request served, the audit trail, and the web console in front of
the same API (``slicesched demo`` prints its URL). Real processes on loopback: ``slicesched
serve``, one executor daemon, ``slicesched console``."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx

from service.graph.connection import Neo4jSettings
from service.harness.console import print_table

TENANT = "umbrella"


def governance_demo(neo4j: Neo4jSettings, out_dir: Path | None = None) -> dict[str, Any]:
    """Run the flow, then the new tenant's first workflow (a code-generation fan-out) with its
    per-step timeline (``out_dir/workflow_timeline.png``); returns what it saw."""
    from service.harness.live_tenants import reset_tenants
    from service.harness.stack import LiveStack

    reset_tenants(neo4j, [TENANT])  # a demo run before this one left its tenant behind
    started = time.time()
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
                workflow = _wait_workflow(tenant, _ok(tenant.post("/v1/workflows", json=CODEGEN))["workflow_id"])
                audit = _ok(tenant.get("/v1/audit", params={"tenant_id": TENANT, "since": started}))["entries"]
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
                     for e in audit[-8:]], title=f"audit log of {TENANT} (this run's last entries)")
        print_workflow(workflow)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            plot_workflow(out_dir / "workflow_timeline.png", workflow)
            print(f"timeline: {out_dir / 'workflow_timeline.png'}")
        return {"request_id": rid, "role": who["role"], "console_url": console, "console_saw_approval": seen,
                "first_request": done["status"], "workflow": workflow}


#: The demo's workflow: a planner fans out to three coders, each coder's code runs in a tool
#: (CPU work in a process of its own), and a reviewer joins them.
CODEGEN: dict[str, Any] = {
    "workflow_id": "codegen-1", "shape": "code-generation", "slo_s": 120.0,
    "input_text": {"task": "a byte-pair tokenizer with tests"},
    "steps": [
        {"step_id": "plan", "kind": "model", "role": "planner", "model": "chat", "inputs": ["task"],
         "template": "Split into three parts: {inputs.task}", "max_output_tokens": 12},
        *[{"step_id": f"code{i}", "kind": "model", "role": "coder", "model": "chat", "uses": ["plan"],
           "template": f"Write part {i} of: {{steps.plan}}", "max_output_tokens": 16} for i in range(3)],
        *[{"step_id": f"run{i}", "kind": "tool", "role": "code-exec", "tool": "python", "uses": [f"code{i}"],
           "duration_s": 0.5 + 0.25 * i, "output_tokens": 24} for i in range(3)],
        {"step_id": "review", "kind": "model", "role": "reviewer", "model": "chat",
         "uses": ["run0", "run1", "run2"], "max_output_tokens": 12},
    ]}


def _wait_workflow(c: httpx.Client, workflow_id: str, timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = _ok(c.get(f"/v1/workflows/{workflow_id}"))
        if got["status"] != "running" or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def print_workflow(w: dict[str, Any]) -> None:
    def s(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}"

    print_table(["step", "kind", "role", "status", "start s", "end s", "took s", "tokens", "request"],
                [[st["step_id"], st["kind"], st["role"], st["status"], s(st["start_s"]), s(st["end_s"]),
                  s(st["duration_s"]), st["output_tokens"], st["request_id"] or ""] for st in w["steps"]],
                title=f"workflow {w['workflow_id']} ({w['shape']}): {w['status']} in "
                      f"{(w['e2e_s'] or 0):.2f}s, SLO {w['slo_s']:.0f}s " + ("met" if w["met_slo"] else "missed"))


def plot_workflow(path: Path, w: dict[str, Any]) -> None:
    """A Gantt chart of the workflow's steps: model calls and tool calls, seconds from submission."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [st for st in w["steps"] if st["start_s"] is not None]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(steps) + 1.5))
    for y, st in enumerate(reversed(steps)):
        end = st["end_s"] if st["end_s"] is not None else st["start_s"]
        ax.barh(y, end - st["start_s"], left=st["start_s"], color="#2f5fd0" if st["kind"] == "model" else "#d08a2f")
        ax.text(end, y, f" {st['role']}", va="center", fontsize=8)
    ax.set_yticks(range(len(steps)), [st["step_id"] for st in reversed(steps)])
    ax.set_xlabel("seconds from submission")
    ax.set_title(f"workflow {w['workflow_id']}: model calls (blue) and tool calls (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
