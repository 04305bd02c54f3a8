"""The live distributional predictor: finished workflow steps are recorded and exported (and
`predictors train` reads the export), a scheduled refit swaps a new model in (version + 1,
deterministic for its records and seed, monotone quantiles, calibration and metrics reported),
the slack policy's keys in the running service come from the predictions, and bad
configuration is refused with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from learned.records import read_records
from service.api.responses import PredictorOut
from service.core.tail import P99, QUANTILES, CallFeatures, NaivePredictor
from service.domain.error import InvalidInputError
from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from service.live.settings import ServiceSettings
from tests.api.conftest import ADMIN, auth, new_tenant, settings
from tests.api.test_workflows import _model, _tool, _wait

SEED = 11


@pytest.fixture(scope="module")
def stack(neo4j: Neo4jSettings) -> Iterator[LiveStack]:
    env = {"SLICESCHED_PREDICTOR": "naive", "SLICESCHED_PREDICTOR_REFIT_S": "0.5",
           "SLICESCHED_PREDICTOR_MIN_NEW": "5", "SLICESCHED_PREDICTOR_SEED": str(SEED)}
    with LiveStack(neo4j=neo4j, queue="slack", lease_ttl_s=3.0, heartbeat_s=0.5, extra_env=env) as s:
        s.start_executor("lp", ["cpu:0"])
        yield s


def _until(fn: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_steps_are_recorded_exported_and_a_scheduled_refit_swaps_in(stack: LiveStack, tmp_path: Path) -> None:
    from learned.distributional import DistributionalPredictor
    from service.cli.predictors import predictors_main
    from service.live.predictors import retrain

    t = f"lp{uuid.uuid4().hex[:6]}"
    with stack.client() as admin:
        key = admin.post("/v1/tenants", json={"tenant_id": t}).json()["api_key"]
        assert admin.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny", "tenant_id": t}).status_code == 201
        state = admin.get("/v1/predictors").json()
        assert (state["enabled"], state["kind"], state["version"], state["digest"]) == (True, "naive", 1, None)
        assert state["last_refit"] is None and state["calibration"] is None
    stack.wait_devices(1)
    coders = [f"coder{i}" for i in range(3)]
    # five model calls: a scheduled refit (min_new 5) follows the last one, and only it
    wf = {"workflow_id": "fan", "slo_s": 120, "steps": [
        _model("plan", role="planner", template="Plan: {inputs.task}", inputs=["task"]),
        *[_model(c, ["plan"]) for c in coders], *[_tool(f"test{i}", 0.1, [c]) for i, c in enumerate(coders)],
        _model("review", [f"test{i}" for i in range(3)], role="reviewer")], "input_text": {"task": "a parser"}}
    with httpx.Client(base_url=stack.url, headers=auth(key), timeout=30) as c:
        assert c.post("/v1/workflows", json=wf).status_code == 202
        doc = _wait(c, key, "fan", timeout_s=120)
    assert doc["status"] == "done", doc
    steps = {s["step_id"]: s for s in doc["steps"]}
    with stack.client() as admin:
        state = _until(lambda: (s := admin.get("/v1/predictors").json())["version"] >= 2 and s)
        assert state["kind"] == "learned" and state["refits"] == 1 and state["refit_failures"] == 0
        refit = state["last_refit"]
        assert refit["from"] == "naive" and refit["version"] == 2 and refit["seed"] == SEED + 1
        assert refit["trained_calls"] + refit["held_out_calls"] == 5 and refit["held_out_calls"] == 1
        assert refit["trained_tools"] + refit["held_out_tools"] == 3
        cal = state["calibration"]
        assert cal["quantiles"] == list(QUANTILES) and cal["num_calls"] == 1
        for target in ("output_tokens", "latency_s"):
            assert len(cal[target]) == len(QUANTILES) and cal[target] == sorted(cal[target])
            assert all(v in (0.0, 1.0) for v in cal[target])  # one held-out call: covered or not
        assert state["observations"]["recorded_calls"] == 5 and state["observations"]["recorded_tools"] == 3
        export = _until(lambda: (r := admin.get("/v1/predictors/observations")).status_code == 200
                        and r.text.count("\n") == 8 and r)
        assert export.headers["content-type"].startswith("application/x-ndjson")
        assert admin.get("/v1/predictors/observations", params={"limit": 2}).text.count("\n") == 2
        metrics = admin.get("/metrics").text
    # the export: predictors' records format, with where and when each was observed
    lines = [json.loads(line) for line in export.text.splitlines()]
    by_step = {d["step_id"]: d for d in lines}
    assert set(by_step) == set(steps) and {d["workflow_id"] for d in lines} == {"fan"}
    for sid, d in by_step.items():
        assert d["tenant_id"] == t and d["at"] >= doc["created_at"]
        if steps[sid]["kind"] == "model":
            f = d["features"]
            assert d["kind"] == "call" and d["output_tokens"] == steps[sid]["output_tokens"] == 4
            assert f["prompt_tokens"] == steps[sid]["detail"]["prompt_tokens"] and f["model"] == "tiny"
            assert f["workflow_steps"] == 8 and 0.0 <= f["kv_frac"] <= 1.0
            assert f["queue_len"] >= 0 and f["running"] >= 0 and f["queued_prompt_tokens"] >= 0
            assert 0.0 < d["latency_s"] <= steps[sid]["duration_s"] + 0.5  # submitted to last token
        else:
            assert d["kind"] == "tool" and d["features"] == {"tool": "python", "input_tokens": 4}
            assert 0.1 <= d["duration_s"] <= steps[sid]["duration_s"]
    assert (by_step["plan"]["features"]["depth"], by_step["coder1"]["features"]["depth"],
            by_step["review"]["features"]["depth"]) == (0, 1, 3)
    assert by_step["review"]["features"]["num_uses"] == 3
    assert by_step["review"]["features"]["role"] == "reviewer"
    # the history feature: the reviewer's tenant had coders before, not reviewers
    assert by_step["review"]["features"]["tenant_log_output"] == 0.0
    assert [by_step[c]["features"]["tenant_log_output"] for c in coders] == [0.0] * 3  # run together
    # deterministic: the same records (the service's snapshot, oldest first) and seed, the same model
    path = tmp_path / "live.jsonl"
    path.write_text(export.text)
    calls, tools = read_records(path)
    assert len(calls) == 5 and len(tools) == 3
    mine, my_cal, _ = retrain(NaivePredictor(), calls, tools, seed=SEED + 1)
    assert mine.digest() == state["digest"] and my_cal == {k: v for k, v in cal.items() if v is not None}
    q = mine.call_quantiles([c.features for c in calls])
    assert np.all(np.diff(q, axis=-1) >= 0) and np.all(q > 0)
    # the metrics
    assert "slicesched:predictor_version 2.0" in metrics
    assert 'slicesched:predictor_observations_recorded_total{kind="call"} 5.0' in metrics
    assert 'slicesched:predictor_coverage{quantile="0.99",target="latency_s"}' in metrics
    assert "slicesched:predictor_refits_total 1.0" in metrics
    # `predictors train` reads the live export as it reads replay records
    assert predictors_main(["train", str(path), "--out", str(tmp_path / "p"), "--epochs", "2"]) == 0
    assert DistributionalPredictor.load(tmp_path / "p").vocab.roles == ("coder", "planner", "reviewer")
    # a refit asked for now fine-tunes the learned one: version 3, another model, nothing new needed
    with stack.client() as admin:
        r = admin.post("/v1/predictors/refit")
        assert r.status_code == 200, r.text
        again = r.json()
        assert PredictorOut.model_validate(again).model_dump(mode="json", exclude_unset=True, by_alias=True) == again
        assert again["version"] == 3 and again["last_refit"]["from"] == "learned"
        assert again["digest"] not in (None, state["digest"])
        assert again["calibration_before"] == cal  # the model it replaced, on the same held-out call
        assert admin.get("/readyz").status_code == 200


def test_the_slack_policy_orders_live_requests_by_predicted_latest_start(
        make_client: Callable[..., TestClient], tmp_path: Path) -> None:
    """No executor: the requests stay queued. A workflow step submitted after an independent
    request goes first with a predictor (its predicted p99 path, three tools of a p99 about 4 s
    each, does not fit its 5 s SLO) and second without (equal prompts and budgets: by arrival)."""
    heads = {}
    for predictor in ("naive", None):
        client = make_client(queue="slack", predictor=predictor, observations_file=tmp_path / f"{predictor}.jsonl")
        t = f"s{uuid.uuid4().hex[:6]}"
        key = new_tenant(client, t)
        assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key)).status_code == 201
        r = client.post("/v1/requests", json={"model_id": "m", "prompt": "hi", "max_tokens": 4}, headers=auth(key))
        assert r.status_code == 202, r.text
        alone = r.json()["request_id"]
        wf = {"workflow_id": "tight", "slo_s": 5, "steps": [
            _model("a", template="hi"), _tool("t1", 1, ["a"]), _tool("t2", 1, ["t1"]), _tool("t3", 1, ["t2"])]}
        assert client.post("/v1/workflows", json=wf, headers=auth(key)).status_code == 202
        svc = client.app.state.service  # type: ignore[attr-defined]
        queue = svc.state.queues[f"{t}/m"]
        _until(lambda q=queue: len(q) == 2, timeout_s=10)
        step = next(rid for rid in queue if rid != alone)
        heads[predictor] = queue.peek_request({}).request_id == step
        by_id = {q.request_id: q for q in queue.requests()}
        if predictor == "naive":
            naive = NaivePredictor()
            p99 = float(naive.call_quantiles([CallFeatures("request", "tiny", 0.0, 2, 0, 0, 1, 0.0, 0, 0, 0.0)])[0][1, P99])
            assert svc.state.policy.key(by_id[alone])[0] == pytest.approx(by_id[alone].deadline_s - p99)
            run = svc.workflows.get(t, "tight")
            # the step's cost from its document (4 prompt tokens); t1 reads its p50 output, capped at
            # 4 tokens, t2 and t3 the 8 tokens of the tool before
            step_f = CallFeatures("coder", "tiny", 0.0, 4, 0, 0, 4, 0.0, 0, 0, 0.0)
            path = (float(naive.call_quantiles([step_f])[0][1, P99]) + float(naive.tool_quantiles([_tf(4)])[0][P99])
                    + 2 * float(naive.tool_quantiles([_tf(8)])[0][P99]))
            assert svc.state.policy.key(by_id[step])[0] == pytest.approx(run.created_at + 5 - path, rel=1e-9)
        else:
            q = by_id[alone]
            assert svc.state.policy.key(q)[0] == pytest.approx(q.deadline_s - 0.02 * q.estimated_output_tokens)
        assert client.post("/v1/workflows/tight/cancel", headers=auth(key)).status_code == 200
    assert heads == {"naive": True, None: False}


def _tf(n: int) -> Any:
    from service.core.tail import ToolFeatures

    return ToolFeatures("python", n)


def test_bad_predictor_configuration_is_refused_with_a_clear_message(
        tmp_path: Path, neo4j: Neo4jSettings, monkeypatch: pytest.MonkeyPatch,
        make_client: Callable[..., TestClient]) -> None:
    with pytest.raises(InvalidInputError, match=r"predictor '.*nope': no such folder; give a folder written by "
                                                r"`slicesched predictors train"):
        settings(neo4j, predictor=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match=r"no meta\.json in it"):
        settings(neo4j, predictor=str(tmp_path / "empty"))
    with pytest.raises(InvalidInputError, match=r"predictor_refit_s must be in \(0, 86400\]"):
        settings(neo4j, predictor="naive", predictor_refit_s=0)
    monkeypatch.setenv("SLICESCHED_PREDICTOR_REFIT_S", "often")
    with pytest.raises(InvalidInputError, match="SLICESCHED_PREDICTOR_REFIT_S must be a number, got 'often'"):
        ServiceSettings.from_env(admin_key=ADMIN)
    monkeypatch.delenv("SLICESCHED_PREDICTOR_REFIT_S")
    # a folder with meta.json but no weights: the start fails with the reason
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text('{"call_model": "monotone-state/1"}')
    from service.api.app import create_app

    with pytest.raises(InvalidInputError, match="broken: cannot be loaded"), \
            TestClient(create_app(settings(neo4j, predictor=str(tmp_path / "broken")))):
        pass
    # the command line says the same and exits with an error
    done = subprocess.run([sys.executable, "-m", "service.cli.main", "serve", "--predictor", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no such folder" in done.stderr, done.stderr
    # a service without a predictor refuses a refit; nobody passes the slack key as a parameter
    client = make_client(observations_file=tmp_path / "o.jsonl")
    r = client.post("/v1/predictors/refit", headers=auth(ADMIN))
    assert r.status_code == 409 and "--predictor" in r.json()["error"]["message"]
    state = client.get("/v1/predictors", headers=auth(ADMIN)).json()
    assert (state["enabled"], state["kind"], state["version"]) == (False, "none", 0)
    r = client.put("/v1/queue-policy", json={"queue": "slack", "params": {"latest_start": 1.0}}, headers=auth(ADMIN))
    assert r.status_code == 400 and "latest_start is the service's own" in r.json()["error"]["message"]
    naive = make_client(predictor="naive", observations_file=tmp_path / "n.jsonl")
    r = naive.post("/v1/predictors/refit", headers=auth(ADMIN))
    assert r.status_code == 409 and "no call observation yet" in r.json()["error"]["message"]
