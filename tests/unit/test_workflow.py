"""Workflow DAGs: validation with clear errors, the JSON document, structure; generators are
deterministic for a seed and draw from the real traces."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.domain.error import InvalidInputError
from service.domain.workflow import ModelCall, ToolCall, Workflow, find_cycle
from service.workload.workflows import SHAPES, ShapeConfig, generate, trace_lengths
from tests.conftest import needs_data


def _doc(steps: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"workflow_id": "wf", "tenant_id": "acme", "slo_s": 60.0, "inputs": {"task": 100}, "steps": steps, **kw}


def _m(sid: str, *uses: str, **kw: Any) -> dict[str, Any]:
    return {"step_id": sid, "kind": "model", "role": "coder", "model": "m", "prompt_tokens": 10, "uses": list(uses), **kw}


def test_a_cycle_is_named_in_order() -> None:
    with pytest.raises(InvalidInputError, match=r"cycle: a -> c -> b -> a") as exc:
        Workflow.from_dict(_doc([_m("a", "c"), _m("b", "a"), _m("c", "b"), _m("d")]))
    assert exc.value.culprit == "a"


def test_a_step_using_itself_is_a_cycle() -> None:
    with pytest.raises(InvalidInputError, match=r"cycle: a -> a"):
        Workflow.from_dict(_doc([_m("a", "a")]))


def test_unknown_step_reference_is_named() -> None:
    with pytest.raises(InvalidInputError, match=r"step b: uses unknown step 'ghost'") as exc:
        Workflow.from_dict(_doc([_m("a"), _m("b", "a", "ghost")]))
    assert exc.value.culprit == "ghost"


def test_missing_input_names_the_inputs_given() -> None:
    with pytest.raises(InvalidInputError, match=r"reads input 'image', which the workflow does not give \(inputs: task\)"):
        Workflow.from_dict(_doc([_m("a", inputs=["image"])]))


def test_duplicate_ids_and_bad_documents() -> None:
    with pytest.raises(InvalidInputError, match="duplicate step id 'a'"):
        Workflow.from_dict(_doc([_m("a"), _m("a")]))
    with pytest.raises(InvalidInputError, match="unknown key"):
        Workflow.from_dict(_doc([_m("a", colour="red")]))
    with pytest.raises(InvalidInputError, match="missing key"):
        Workflow.from_dict(_doc([{"step_id": "a", "kind": "tool", "role": "x"}]))
    with pytest.raises(InvalidInputError, match="kind must be one of model, tool"):
        Workflow.from_dict(_doc([{"step_id": "a", "kind": "gpu", "role": "x"}]))
    with pytest.raises(InvalidInputError, match="slo_s must be finite and > 0"):
        Workflow.from_dict(_doc([_m("a")], slo_s=0))
    with pytest.raises(InvalidInputError, match="at least one step"):
        Workflow.from_dict(_doc([]))
    with pytest.raises(InvalidInputError, match=r"template refers to \{steps.b\}"):
        Workflow.from_dict(_doc([_m("a", template="see {steps.b}")]))


def test_document_round_trip_and_structure() -> None:
    doc = _doc([_m("plan", inputs=["task"]), _m("c1", "plan", output_tokens=50), _m("c2", "plan"),
                {"step_id": "t", "kind": "tool", "role": "code-exec", "tool": "python", "uses": ["c1", "c2"],
                 "output_tokens": 30, "duration_s": 1.5},
                _m("review", "t", template="check {steps.t}")])
    w = Workflow.from_dict(doc)
    assert Workflow.from_dict(w.to_dict()) == w
    assert [s.step_id for s in w.order()] == ["plan", "c1", "c2", "t", "review"]
    assert w.roots() == ["plan"]
    assert w.depth() == {"plan": 0, "c1": 1, "c2": 1, "t": 2, "review": 3}
    assert w.prompt_tokens("plan", {}) == 110
    assert w.prompt_tokens("review", {"t": 30}) == 40
    assert isinstance(w.step("t"), ToolCall) and isinstance(w.step("c1"), ModelCall)
    path = w.critical_path({"plan": 1.0, "c1": 5.0, "c2": 2.0, "t": 1.0, "review": 1.0})
    assert path["plan"] == 8.0 and path["c2"] == 4.0
    assert w.critical_path({"plan": 1.0, "c1": 5.0, "c2": 2.0, "t": 1.0, "review": 1.0}, done={"c1"})["plan"] == 5.0


def test_find_cycle_none_on_a_dag() -> None:
    assert find_cycle({"a": [], "b": ["a"], "c": ["a", "b"]}) is None


@needs_data("azure-llm-2023", "servegen")
def test_generators_are_deterministic_and_valid() -> None:
    lengths = trace_lengths()
    cfg = {s: ShapeConfig(s, "llama2-7b", 60.0) for s in SHAPES}
    rates = {"code-generation": 0.5, "deep-research": 0.5, "multimodal": 1.0}
    a = generate(np.random.default_rng(3), lengths, rates, cfg, duration_s=40.0)
    b = generate(np.random.default_rng(3), lengths, rates, cfg, duration_s=40.0)
    c = generate(np.random.default_rng(4), lengths, rates, cfg, duration_s=40.0)
    assert a == b and a != c
    assert {w.shape for w in a} == set(SHAPES)
    assert [w.arrival_s for w in a] == sorted(w.arrival_s for w in a)
    for w in a:
        assert Workflow.from_dict(w.to_dict()) == w
        for s in w.steps:
            assert (s.output_tokens or 0) >= (1 if isinstance(s, ModelCall) else 0)
            if isinstance(s, ToolCall):
                assert s.duration_s is not None and s.duration_s >= 0
        if w.shape == "code-generation":
            coders = [s for s in w.steps if s.role == "coder"]
            assert 2 <= len(coders) <= 5
            assert all(s.uses == ("plan",) for s in coders)
        if w.shape == "multimodal":
            assert [s.role for s in w.order()] == ["preprocess", "vlm"]
