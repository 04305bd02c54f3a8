"""Live workflows: validation writes nothing, a step runs only after its inputs, a cancel cancels
the running steps (a model call's request, a tool's process) and the ones not started, and a
code-generation fan-out runs end to end on a real executor daemon."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from tests.api.conftest import ADMIN, auth, new_tenant


def _tool(step_id: str, seconds: float, uses: list[str] | None = None, tokens: int = 8) -> dict[str, Any]:
    return {"step_id": step_id, "kind": "tool", "role": "code-exec", "tool": "python", "duration_s": seconds,
            "output_tokens": tokens, "uses": uses or []}


def _model(step_id: str, uses: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"step_id": step_id, "kind": "model", "role": extra.pop("role", "coder"), "model": "m",
            "prompt_tokens": 4, "uses": uses or [], "max_output_tokens": 4, **extra}


def _wait(c: Any, key: str, wid: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        doc: dict[str, Any] = c.get(f"/v1/workflows/{wid}", headers=auth(key)).json()
        if doc["status"] != "running":
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(0.1)


@pytest.fixture
def tenant(client: TestClient) -> tuple[str, str]:
    t = f"w{uuid.uuid4().hex[:6]}"
    key = new_tenant(client, t)
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key)).status_code == 201
    return t, key


@pytest.mark.parametrize(("steps", "inputs", "message"), [
    ([_tool("a", 0, ["b"]), _tool("b", 0, ["a"])], {}, "cycle: a -> b -> a"),
    ([_tool("a", 0, ["ghost"])], {}, "unknown step 'ghost'"),
    ([{**_model("a"), "inputs": ["task"]}], {}, "reads input 'task'"),
    ([_model("a", model="nope")], {}, "has no model 'nope'"),
    ([{**_tool("a", 0), "duration_s": None}], {}, "declares its duration_s"),
    ([_tool("a", 0), _tool("a", 0)], {}, "duplicate step id"),
])
def test_a_bad_workflow_is_refused_and_nothing_runs(client: TestClient, tenant: tuple[str, str], steps: Any,
                                                     inputs: Any, message: str) -> None:
    _, key = tenant
    r = client.post("/v1/workflows", json={"workflow_id": "bad", "slo_s": 10, "inputs": inputs, "steps": steps},
                    headers=auth(key))
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert client.get("/v1/workflows", headers=auth(key)).json() == []
    assert client.get("/v1/requests", headers=auth(key)).json() == []


def test_steps_run_after_their_inputs_and_tenants_see_their_own(client: TestClient, tenant: tuple[str, str]) -> None:
    t, key = tenant
    other = new_tenant(client, f"o{t}")
    wf = {"workflow_id": "diamond", "slo_s": 30, "steps": [
        _tool("plan", 0.2), _tool("left", 0.3, ["plan"]), _tool("right", 0.1, ["plan"]),
        _tool("join", 0.1, ["left", "right"], tokens=12)]}
    r = client.post("/v1/workflows", json=wf, headers=auth(key))
    assert r.status_code == 202, r.text
    assert client.post("/v1/workflows", json=wf, headers=auth(key)).status_code == 409  # the id is taken
    doc = _wait(client, key, "diamond")
    assert doc["status"] == "done" and doc["met_slo"] is True, doc
    steps = {s["step_id"]: s for s in doc["steps"]}
    order = [s["step_id"] for s in doc["steps"]]
    assert order[0] == "plan" and order[-1] == "join"
    for name, uses in (("left", ["plan"]), ("right", ["plan"]), ("join", ["left", "right"])):
        assert steps[name]["start_s"] >= max(steps[u]["end_s"] for u in uses), steps
    assert steps["left"]["duration_s"] >= 0.3 and steps["left"]["detail"]["cpu_s"] > 0  # real CPU work, in a process
    assert len(steps["join"]["text"]) == 12
    assert client.get("/v1/workflows/diamond", headers=auth(other)).status_code == 404
    assert [w["workflow_id"] for w in client.get("/v1/workflows", headers=auth(ADMIN)).json()] == ["diamond"]
    assert client.post("/v1/workflows/diamond/cancel", headers=auth(key)).status_code == 409  # already done


def test_cancel_stops_running_steps_and_the_ones_not_started(client: TestClient, tenant: tuple[str, str]) -> None:
    _, key = tenant
    # no executor is registered: the model call stays queued until the cancel
    wf = {"workflow_id": "long", "slo_s": 60, "steps": [
        _tool("tool", 30.0), _model("call"), _model("after", ["tool", "call"], role="reviewer")]}
    assert client.post("/v1/workflows", json=wf, headers=auth(key)).status_code == 202
    deadline = time.monotonic() + 10
    while True:
        doc = client.get("/v1/workflows/long", headers=auth(key)).json()
        rid = next(s["request_id"] for s in doc["steps"] if s["step_id"] == "call")
        if rid is not None:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    r = client.post("/v1/workflows/long/cancel", headers=auth(key))
    assert r.status_code == 200 and time.monotonic() - started < 5  # the 30 s tool process is killed
    doc = r.json()
    assert doc["status"] == "cancelled"
    assert {s["step_id"]: s["status"] for s in doc["steps"]} == {"tool": "cancelled", "call": "cancelled",
                                                                  "after": "cancelled"}
    assert client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["status"] == "cancelled"
    deadline = time.monotonic() + 10  # the audit writer commits entries in the background
    while True:
        entries = client.get("/v1/audit", params={"action": "workflow", "target": "long"},
                             headers=auth(ADMIN)).json()["entries"]
        if {"workflow.submit", "workflow.cancel"} <= {e["action"] for e in entries} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert {"workflow.submit", "workflow.cancel"} <= {e["action"] for e in entries}


@pytest.fixture(scope="module")
def stack(neo4j: Neo4jSettings) -> Iterator[LiveStack]:
    with LiveStack(neo4j=neo4j, lease_ttl_s=3.0, heartbeat_s=0.5) as s:
        s.start_executor("wf", ["cpu:0"])
        yield s


def test_a_code_generation_fan_out_end_to_end(stack: LiveStack) -> None:
    t = f"cg{uuid.uuid4().hex[:6]}"
    with stack.client() as admin:
        key = admin.post("/v1/tenants", json={"tenant_id": t}).json()["api_key"]
        assert admin.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny", "tenant_id": t}).status_code == 201
    stack.wait_devices(1)
    coders = [f"coder{i}" for i in range(3)]
    wf = {"workflow_id": "codegen", "slo_s": 120, "shape": "code-generation", "inputs": {},
          "steps": [_model("plan", role="planner", template="Plan: {inputs.task}", inputs=["task"]),
                    *[_model(c, ["plan"], template=f"Write part {i}: {{steps.plan}}") for i, c in enumerate(coders)],
                    *[_tool(f"test{i}", 0.2, [c]) for i, c in enumerate(coders)],
                    _model("review", [f"test{i}" for i in range(3)], role="reviewer")],
          "input_text": {"task": "a tokenizer"}}
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        r = c.post("/v1/workflows", json=wf)
        assert r.status_code == 202, r.text
        doc = _wait(c, key, "codegen", timeout_s=120)
        assert doc["status"] == "done", doc
        steps = {s["step_id"]: s for s in doc["steps"]}
        for i, coder in enumerate(coders):
            assert steps[coder]["start_s"] >= steps["plan"]["end_s"]
            assert steps[f"test{i}"]["start_s"] >= steps[coder]["end_s"]
            got = c.get(f"/v1/requests/{steps[coder]['request_id']}").json()
            assert got["status"] == "done" and len(got["output_tokens"]) == 4
        assert steps["review"]["start_s"] >= max(steps[f"test{i}"]["end_s"] for i in range(3))
        assert steps["plan"]["detail"]["prompt_tokens"] == len(b"Plan: a tokenizer")
