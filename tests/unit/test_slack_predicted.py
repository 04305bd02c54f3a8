"""The slack policy's predicted keys (service/core/slack.py) and the live predictor's refit
(service/live/predictors.py): a workflow step's latest start is its deadline minus the predicted
p99 of its critical path from that step on; an independent request's is its deadline minus its
predicted p99 latency; the order follows the predictions, not the token budgets; a refit is
deterministic for its records and seed, monotone, and calibrated on the newest fifth."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from service.core.queue import QueuedRequest, RequestQueue, SlackPolicy
from service.core.slack import request_latest_start, step_costs_p99, workflow_latest_start
from service.core.tail import P99, QUANTILES, CallFeatures, NaivePredictor, ToolFeatures
from service.domain.workflow import ModelCall, Workflow
from service.sim.workflow import CallRecord, ToolRecord


class RolePredictor:
    """p99 latency per role (a step's other quantiles below it); a call's p50 output is
    ``out50``; a tool's p99 duration is 2 s plus 1 ms per input token."""

    def __init__(self, p99_s: dict[str, float], out50: int = 10) -> None:
        self.p99_s, self.out50 = p99_s, out50
        self.prompts: list[int] = []

    def call_quantiles(self, feats: Sequence[CallFeatures]) -> np.ndarray:
        out = np.empty((len(feats), 2, len(QUANTILES)))
        for i, f in enumerate(feats):
            self.prompts.append(f.prompt_tokens)
            out[i, 0] = np.linspace(self.out50 / 2, self.out50 * 3, len(QUANTILES))
            out[i, 0, QUANTILES.index(0.5)] = self.out50
            out[i, 1] = np.linspace(0.1, self.p99_s[f.role], len(QUANTILES))
        return out

    def tool_quantiles(self, feats: Sequence[ToolFeatures]) -> np.ndarray:
        return np.array([np.linspace(0.1, 2.0 + 1e-3 * f.input_tokens, len(QUANTILES)) for f in feats])


WF = Workflow.from_dict({"workflow_id": "w", "tenant_id": "t", "slo_s": 100.0, "arrival_s": 1000.0,
                         "inputs": {"task": 50}, "steps": [
                             {"step_id": "plan", "kind": "model", "role": "planner", "model": "m",
                              "prompt_tokens": 20, "inputs": ["task"]},
                             {"step_id": "c0", "kind": "model", "role": "coder", "model": "m", "uses": ["plan"]},
                             {"step_id": "c1", "kind": "model", "role": "coder", "model": "m", "uses": ["plan"]},
                             {"step_id": "test", "kind": "tool", "role": "code-exec", "tool": "python",
                              "uses": ["c0"], "output_tokens": 5},
                             {"step_id": "review", "kind": "model", "role": "reviewer", "model": "m",
                              "uses": ["test", "c1"]}]})


def _features(s: ModelCall, prompt: int) -> CallFeatures:
    return CallFeatures(s.role, "m", 1.0, prompt, 0, len(s.uses), 5, 0.0, 0, 0, 0.0)


def test_a_steps_latest_start_is_the_deadline_minus_its_predicted_p99_path() -> None:
    pred = RolePredictor({"planner": 3.0, "coder": 7.0, "reviewer": 4.0})
    cost = step_costs_p99(WF, {}, pred, _features)
    # prompts: plan = 20 own + 50 input; a coder = the plan's predicted p50 (10); the tool = c0's p50
    assert pred.prompts[0] == 70 and pred.prompts[1] == 10
    assert cost["plan"] == 3.0 and cost["c0"] == 7.0 and cost["review"] == 4.0
    assert cost["test"] == pytest.approx(2.0 + 1e-3 * 10)
    deadline = WF.deadline_s
    # plan -> c0 -> test -> review is the critical path (c1 has no tool after it)
    assert workflow_latest_start(WF, "plan", cost, (), deadline) == pytest.approx(deadline - (3 + 7 + 2.01 + 4))
    assert workflow_latest_start(WF, "c1", cost, (), deadline) == pytest.approx(deadline - (7 + 4))
    # finished steps cost nothing; their true outputs make the prompts downstream
    done = step_costs_p99(WF, {"plan": 400, "c0": 30}, pred, _features)
    assert pred.prompts[-4:] == [70, 400, 400, 5 + 10]  # review: the tool's declared 5 + c1's predicted p50
    assert done["test"] == pytest.approx(2.0 + 1e-3 * 30)  # the tool reads c0's true 30 tokens
    assert workflow_latest_start(WF, "c1", done, {"plan", "c0"}, deadline) == pytest.approx(deadline - (7 + 4))


def test_a_step_with_a_longer_predicted_tail_goes_first_whatever_its_budget() -> None:
    """Two coders of two workflows with the same deadline: the one whose successors are predicted
    slower has less slack. Token budgets say the opposite (the slow one asks for fewer tokens), so
    without predictions the order flips."""
    slow = RolePredictor({"planner": 1.0, "coder": 2.0, "reviewer": 30.0})
    fast = RolePredictor({"planner": 1.0, "coder": 2.0, "reviewer": 1.0})
    keys: dict[str, float] = {}
    for rid, pred in (("w1/c1", slow), ("w2/c1", fast)):
        cost = step_costs_p99(WF, {"plan": 10}, pred, _features)
        keys[rid] = workflow_latest_start(WF, "c1", cost, {"plan"}, WF.deadline_s)
    reqs = [QueuedRequest("w2/c1", "t", "m", 1001.0, 10, 500, deadline_s=1100.0),
            QueuedRequest("w1/c1", "t", "m", 1002.0, 10, 5, deadline_s=1100.0)]

    def order(policy: SlackPolicy) -> list[str]:
        queue: RequestQueue[str] = RequestQueue(policy)
        for q in reqs:
            queue.push(q, q.request_id)
        return [queue.pop({}) for _ in reqs]

    assert order(SlackPolicy(latest_start=lambda q: keys.get(q.request_id))) == ["w1/c1", "w2/c1"]
    assert order(SlackPolicy()) == ["w2/c1", "w1/c1"]  # 500 budgeted tokens x 0.02 s: less slack


def test_an_independent_requests_slack_uses_its_predicted_p99_latency() -> None:
    pred = NaivePredictor()
    f = CallFeatures("request", "m", 1.0, 100, 0, 0, 1, 0.0, 0, 0, 0.0)
    p99 = float(pred.call_quantiles([f])[0][1, P99])
    assert request_latest_start(50.0, p99) == pytest.approx(50.0 - p99)
    assert request_latest_start(math.inf, p99) == math.inf  # no deadline: after every one with one


def _records(n: int, seed: int) -> tuple[list[CallRecord], list[ToolRecord]]:
    rng = np.random.default_rng(seed)
    calls = [CallRecord(CallFeatures(["coder", "planner"][i % 2], "tiny", 0.01, int(rng.integers(5, 200)), i % 3, 1, 4,
                                     1.0, int(rng.integers(0, 5)), 1, 0.1, 40), int(rng.integers(1, 64)),
                        float(rng.lognormal(-1.0, 0.4))) for i in range(n)]
    tools = [ToolRecord(ToolFeatures("python", int(rng.integers(1, 50))), float(rng.lognormal(-1.5, 0.3)))
             for _ in range(n // 2)]
    return calls, tools


def test_a_live_refit_is_deterministic_for_its_records_and_seed_and_monotone() -> None:
    from service.live.predictors import retrain

    calls, tools = _records(100, seed=3)
    a, cal_a, before = retrain(NaivePredictor(), calls, tools, seed=7)
    b, cal_b, _ = retrain(NaivePredictor(), calls, tools, seed=7)
    c, _, _ = retrain(NaivePredictor(), calls, tools, seed=8)
    assert a.digest() == b.digest() and cal_a == cal_b
    assert a.digest() != c.digest()
    assert cal_a["num_calls"] == 20 and cal_a["num_tools"] == 10  # the newest fifth is held out
    assert before["num_calls"] == 20 and len(before["latency_s"]) == len(QUANTILES)
    assert all(0.0 <= v <= 1.0 for v in cal_a["latency_s"]) and cal_a["latency_s"] == sorted(cal_a["latency_s"])
    q = a.call_quantiles([r.features for r in calls])
    assert np.all(np.diff(q, axis=-1) >= 0) and np.all(q > 0)
    # a learned predictor is fine-tuned (same vocabulary), again deterministically
    tuned, _, _ = retrain(a, calls, tools, seed=9)
    tuned2, _, _ = retrain(a, calls, tools, seed=9)
    assert tuned.digest() == tuned2.digest() != a.digest() and tuned.vocab == a.vocab
    assert np.all(np.diff(tuned.tool_quantiles([t.features for t in tools]), axis=-1) >= 0)


def test_a_refit_without_tools_still_predicts_tools_monotonically() -> None:
    from service.live.predictors import retrain

    calls, _ = _records(30, seed=4)
    pred, cal, _ = retrain(NaivePredictor(), calls, [], seed=0)
    assert cal["num_tools"] == 0 and "tool_duration_s" not in cal
    tq: Any = pred.tool_quantiles([ToolFeatures("python", 10)])
    assert np.all(np.diff(tq, axis=-1) >= 0) and np.all(tq > 0)


def test_observations_are_appended_and_restored_at_start(tmp_path: Any) -> None:
    """What one process recorded, the next keeps for its refits (the window) and its history."""
    import asyncio

    from service.live.predictors import LivePredictors, PredictorSettings

    path = tmp_path / "obs" / "observations.jsonl"
    calls, tools = _records(6, seed=5)

    async def first() -> None:
        live = LivePredictors(PredictorSettings(window=10), path)
        await live.start()
        for i, c in enumerate(calls):
            live.observe_call(c.features, c.output_tokens, c.latency_s, tenant_id="t", workflow_id="w",
                              step_id=f"s{i}", at=1.0)
        live.observe_tool(tools[0].features, tools[0].duration_s, tenant_id="t", workflow_id="w", step_id="x", at=2.0)
        assert live.public()["observations"]["unwritten"] == 7
        await live.flush()
        assert live.public()["observations"]["unwritten"] == 0

    async def second() -> LivePredictors:
        live = LivePredictors(PredictorSettings(source="naive", window=4), path)
        await live.start()
        return live

    asyncio.run(first())
    live = asyncio.run(second())
    assert list(live.calls) == calls[-4:] and list(live.tools) == tools[:1]  # the newest, up to the window
    assert (live.restored, live.version, live.kind) == (7, 1, "naive")
    coder = [c.output_tokens for c in calls if c.features.role == "coder"]
    assert live.history("t", "coder") == pytest.approx(sum(math.log(n) for n in coder) / len(coder))
