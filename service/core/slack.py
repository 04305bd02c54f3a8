"""The slack policy's latest start times from a distributional predictor (live and replay).

Pure: no I/O, no wall clock. A latest start is an absolute time (the clock of the deadline):
:class:`~service.core.queue.SlackPolicy` orders by it, smallest first.

- A workflow's step: the workflow's deadline minus the predicted p99 of the work left on its
  critical path from that step on (the step itself and its successors; finished steps cost 0).
  A step's p99 cost is its unloaded one: a model call on an idle replica (its queueing is what
  the order decides, so it is not counted as work), a tool its duration. A prompt is built from
  the true outputs of the steps that finished and the predicted p50 output of the others.
- An independent request: its own deadline minus its predicted p99 latency on an idle replica.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from service.core.tail import P50, P99, CallFeatures, TailPredictor, ToolFeatures
from service.domain.workflow import ModelCall, ToolCall, Workflow

__all__ = ["request_latest_start", "step_costs_p99", "workflow_latest_start"]


def step_costs_p99(workflow: Workflow, outputs: Mapping[str, int], predictor: TailPredictor,
                   features_of: Callable[[ModelCall, int], CallFeatures]) -> dict[str, float]:
    """Step id -> predicted p99 seconds of the step on an idle replica (tool: its duration).

    ``outputs``: output tokens of the finished steps (the truth); the other steps' outputs are
    the predicted p50 (a tool's: its declared ``output_tokens``). ``features_of(step, prompt)``
    gives a model call's features with that prompt length on an idle replica."""
    known = dict(outputs)
    cost: dict[str, float] = {}
    for s in workflow.order():  # a step's prompt needs its uses' outputs: one at a time, in order
        prompt = workflow.prompt_tokens(s.step_id, known)
        if isinstance(s, ToolCall):
            cost[s.step_id] = float(predictor.tool_quantiles([ToolFeatures(s.tool, prompt)])[0][P99])
            known.setdefault(s.step_id, s.output_tokens)
            continue
        q = predictor.call_quantiles([features_of(s, max(1, prompt))])[0]
        cost[s.step_id] = float(q[1, P99])
        predicted = max(1, int(q[0, P50]))
        if s.max_output_tokens is not None:
            predicted = min(predicted, s.max_output_tokens)
        known.setdefault(s.step_id, predicted)
    return cost


def workflow_latest_start(workflow: Workflow, step_id: str, cost_p99: Mapping[str, float], done: Collection[str],
                          deadline_s: float) -> float:
    """``deadline_s`` minus the p99 critical path from ``step_id`` to the workflow's end."""
    return deadline_s - workflow.critical_path(cost_p99, done=done)[step_id]


def request_latest_start(deadline_s: float, p99_latency_s: float) -> float:
    """An independent request's: its deadline minus its predicted p99 latency."""
    return deadline_s - p99_latency_s
