"""Workflows survive a restart of the service (kill -9 included): a running workflow resumes and
finishes with each finished step run once (its model call not made again), a model call still
queued re-attaches to its request, a running tool runs again; ended workflows stay readable, to
their tenant only, and a cancelled one stays cancelled. Real processes: ``slicesched serve``, a
``slicesched executor`` daemon, the session's Neo4j."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack


@pytest.fixture(scope="module")
def stack(neo4j: Neo4jSettings) -> Iterator[LiveStack]:
    with LiveStack(neo4j=neo4j, lease_ttl_s=2.0, heartbeat_s=0.4) as s:
        yield s


def _tool(step_id: str, seconds: float, uses: list[str] | None = None, tokens: int = 8) -> dict[str, Any]:
    return {"step_id": step_id, "kind": "tool", "role": "code-exec", "tool": "python", "duration_s": seconds,
            "output_tokens": tokens, "uses": uses or []}


def _model(step_id: str, uses: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"step_id": step_id, "kind": "model", "role": extra.pop("role", "coder"), "model": "m",
            "uses": uses or [], "max_output_tokens": 4, **extra}


def _tenant(stack: LiveStack, prefix: str) -> tuple[str, str]:
    t = f"{prefix}{uuid.uuid4().hex[:6]}"
    with stack.client() as admin:
        r = admin.post("/v1/tenants", json={"tenant_id": t})
        assert r.status_code == 201, r.text
        key = str(r.json()["api_key"])
        assert admin.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny", "tenant_id": t}).status_code == 201
    return t, key


def _get(c: httpx.Client, wid: str) -> dict[str, Any] | None:
    try:
        r = c.get(f"/v1/workflows/{wid}")
    except httpx.HTTPError:
        return None  # the service is restarting
    return dict(r.json()) if r.status_code == 200 else None


def _until(c: httpx.Client, wid: str, ok: Any, timeout_s: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        doc = _get(c, wid)
        if doc is not None and ok(doc):
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(0.1)


def _steps(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step_id"]: s for s in doc["steps"]}


def test_a_killed_service_resumes_a_workflow_and_runs_no_finished_step_again(stack: LiveStack) -> None:
    _, key = _tenant(stack, "rs")
    stack.start_executor("r1", ["cpu:0"])
    stack.wait_devices(1)
    # plan (a model call) fans out to a short tool (gate) and a long one (work); ask (a model
    # call) waits for gate, review for ask and work
    wf = {"workflow_id": "resume", "slo_s": 300, "inputs": {},
          "steps": [_model("plan", role="planner", template="Plan: {inputs.task}", inputs=["task"]),
                    _tool("gate", 4.0, ["plan"]), _tool("work", 10.0, ["plan"], tokens=10),
                    _model("ask", ["gate"], template="Ask about {steps.gate}"),
                    _model("review", ["ask", "work"], role="reviewer")],
          "input_text": {"task": "a parser"}}
    with stack.client(key) as c:
        r = c.post("/v1/workflows", json=wf)
        assert r.status_code == 202, r.text
        _until(c, "resume", lambda d: _steps(d)["plan"]["status"] == "done")
        stack.stop_executor("r1", kill=True)  # at once: from here a model call stays queued (ask's)
        before = _until(c, "resume", lambda d: _steps(d)["ask"]["request_id"] is not None)
        b = _steps(before)
        assert b["gate"]["status"] == "done" and b["work"]["status"] == "running", before
        assert c.get(f"/v1/requests/{b['ask']['request_id']}").json()["status"] == "queued"
        killed_s = time.time() - before["created_at"]
        stack.restart_server(kill=True)  # kill -9: what was only in memory is gone
        stack.start_executor("r2", ["cpu:0"])
        doc = _until(c, "resume", lambda d: d["status"] != "running", timeout_s=120)
        assert doc["status"] == "done", doc
        s = _steps(doc)
        assert all(st["status"] == "done" for st in s.values()), s
        # finished steps kept their run: the same request, result and times; nothing ran twice
        for step_id in ("plan", "gate"):
            assert s[step_id]["request_id"] == b[step_id]["request_id"]
            assert s[step_id]["text"] == b[step_id]["text"] and s[step_id]["end_s"] == b[step_id]["end_s"]
        assert "reruns" not in s["gate"]["detail"]
        assert s["ask"]["request_id"] == b["ask"]["request_id"]  # the queued call re-attached to its request
        assert s["work"]["detail"]["reruns"] == 1 and s["work"]["start_s"] >= killed_s  # the running tool ran again
        assert len(s["work"]["text"]) == 10
        assert s["review"]["start_s"] >= max(s["ask"]["end_s"], s["work"]["end_s"])
        requests = c.get("/v1/requests").json()
        assert sorted(q["request_id"] for q in requests) == sorted(s[x]["request_id"] for x in ("plan", "ask", "review"))
        for step_id in ("plan", "ask", "review"):
            got = c.get(f"/v1/requests/{s[step_id]['request_id']}").json()
            assert got["status"] == "done" and len(got["output_tokens"]) == s[step_id]["output_tokens"] > 0
        assert s["plan"]["detail"]["prompt_tokens"] == len(b"Plan: a parser")
        assert s["ask"]["detail"]["prompt_tokens"] == len(f"Ask about {s['gate']['text']}".encode())
    stack.stop_executor("r2")


def test_ended_workflows_stay_readable_to_their_tenant_and_a_cancel_stays(stack: LiveStack) -> None:
    t, key = _tenant(stack, "re")
    _, other = _tenant(stack, "ro")
    with stack.client(key) as c:
        quick = {"workflow_id": "quick", "slo_s": 60, "steps": [_tool("a", 0.1), _tool("b", 0.1, ["a"], tokens=5)]}
        assert c.post("/v1/workflows", json=quick).status_code == 202
        done = _until(c, "quick", lambda d: d["status"] != "running")
        assert done["status"] == "done", done
        # no executor serves the model: the call stays queued until the cancel
        slow = {"workflow_id": "slow", "slo_s": 60, "steps": [_tool("tool", 30.0), _model("call"),
                                                              _model("after", ["tool", "call"])]}
        assert c.post("/v1/workflows", json=slow).status_code == 202
        _until(c, "slow", lambda d: _steps(d)["call"]["request_id"] is not None)
        cancelled = c.post("/v1/workflows/slow/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        rid = _steps(cancelled.json())["call"]["request_id"]
        stack.restart_server(kill=True)
        again = _until(c, "quick", lambda d: True)
        assert again == done  # the same document: status, times, texts
        slow_doc = _until(c, "slow", lambda d: True)
        assert slow_doc == cancelled.json()
        assert {st["status"] for st in slow_doc["steps"]} == {"cancelled"}
        assert c.post("/v1/workflows/slow/cancel").status_code == 409
        assert c.get(f"/v1/requests/{rid}").json()["status"] == "cancelled"
        assert c.post("/v1/workflows", json=quick).status_code == 409  # its id is still taken
        assert sorted(w["workflow_id"] for w in c.get("/v1/workflows").json()) == ["quick", "slow"]
        time.sleep(1.0)
        assert _until(c, "slow", lambda d: True)["status"] == "cancelled"  # nothing resumed it
    with stack.client(other) as o:
        assert o.get("/v1/workflows/quick").status_code == 404
        assert o.get("/v1/workflows/slow").status_code == 404
        assert o.get("/v1/workflows").json() == []
        assert o.get("/v1/workflows/quick", params={"tenant_id": t}).status_code == 404
