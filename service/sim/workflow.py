"""Simulated workflow execution: steps released when their inputs complete.

A :class:`WorkflowDriver` sits on a :class:`~service.sim.cluster.SimulatedCluster` and owns two
event types (:class:`~service.sim.engine.WorkflowArrived`, :class:`~service.sim.engine.ToolFinished`)
and the cluster's ``on_done`` hook. A workflow's arrival releases its root steps; a step is
released at the instant its last used step finishes, never earlier (a test holds it). A model
call becomes a request of its tenant's model (id ``<workflow>/<step>``, prompt from
:meth:`~service.domain.workflow.Workflow.prompt_tokens` with the true outputs of the steps it
uses, fitted to the model's context; output its true length); a tool call takes one of
``tool_slots`` CPU slots for its duration (FIFO when all are busy). A dropped call fails its
workflow (its other steps still run; it is reported late).

Pure: no wall clock, no I/O; deterministic for the cluster's seed. Predictions come from an
injected :class:`~service.core.tail.TailPredictor` and are asked only by routers, the slack
policy's :meth:`WorkflowDriver.latest_start` and scalers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from service.core.queue import QueuedRequest
from service.core.slack import step_costs_p99
from service.core.tail import CallFeatures, TailPredictor, ToolFeatures
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec
from service.domain.workflow import ModelCall, ToolCall, Workflow
from service.sim.cluster import SimulatedCluster
from service.sim.engine import Event, RequestArrived, ToolFinished, WorkflowArrived
from service.sim.report import RequestOutcome

__all__ = ["IDLE", "CallRecord", "ReplicaState", "StepTiming", "ToolRecord", "WorkflowDriver", "WorkflowObserver",
           "WorkflowOutcome", "model_params_b", "with_state"]


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a predictor may know of a replica's runtime state."""

    queue_len: int  # waiting plus preempted requests
    running: int  # prefilling plus decoding
    kv_frac: float  # KV bytes over the device's memory
    queued_prompt_tokens: int  # prompt tokens of the waiting requests


IDLE = ReplicaState(0, 0, 0.0, 0)


@dataclass(frozen=True, slots=True)
class StepTiming:
    step_id: str
    kind: str
    role: str
    released_s: float  # its inputs were complete
    finished_s: float  # nan: never (dropped)
    replica_id: str  # "" for a tool call or a dropped one
    output_tokens: int


@dataclass(frozen=True, slots=True)
class WorkflowOutcome:
    workflow_id: str
    tenant_id: str
    shape: str
    arrival_s: float
    finish_s: float  # the last step's end (nan: not finished by the cut-off)
    slo_s: float
    failed: bool  # a call was dropped (could never fit a replica)
    steps: tuple[StepTiming, ...]

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def slo_met(self) -> bool:
        return not self.failed and self.latency_s <= self.slo_s


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A finished model call: its features at release on the replica it ran on, and the truth."""

    features: CallFeatures
    output_tokens: int
    latency_s: float  # release to last token


@dataclass(frozen=True, slots=True)
class ToolRecord:
    features: ToolFeatures
    duration_s: float  # start on a slot to finish (the predicted quantity: no slot queueing)


class WorkflowObserver(Protocol):
    def call_finished(self, record: CallRecord) -> None: ...

    def tool_finished(self, record: ToolRecord) -> None: ...


def with_state(f: CallFeatures, s: ReplicaState) -> CallFeatures:
    """The same call on a replica in state ``s``."""
    return replace(f, queue_len=s.queue_len, running=s.running, kv_frac=s.kv_frac,
                   queued_prompt_tokens=s.queued_prompt_tokens)


def model_params_b(model: str) -> float:
    c = MODEL_CONFIGS[model]
    per_layer = 4 * c.d_model * c.d_model + 3 * c.d_model * c.d_ff
    return (c.n_layers * per_layer + 2 * c.vocab_size * c.d_model) / 1e9


@dataclass(slots=True, eq=False)
class _Run:
    """One workflow in flight."""

    workflow: Workflow
    pending: dict[str, int]  # step -> used steps not finished
    succ: dict[str, list[str]]
    depth: dict[str, int]
    outputs: dict[str, int] = field(default_factory=dict)
    released: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    replica: dict[str, str] = field(default_factory=dict)
    eta99: dict[str, float] = field(default_factory=dict)  # predicted p99 finish of routed calls
    failed: bool = False
    p99_cost: dict[str, float] | None = None  # per step, unloaded (cached: slack, tail router)


class WorkflowDriver:
    """Runs workflows on ``cluster`` (see the module docstring). ``predictor``: needed by
    :meth:`latest_start` and the tail-aware router and scaler; ``None`` otherwise."""

    def __init__(self, cluster: SimulatedCluster, *, tool_slots: int = 64, predictor: TailPredictor | None = None,
                 observers: Sequence[WorkflowObserver] = ()) -> None:
        if tool_slots < 1:
            raise ValueError(f"tool_slots must be >= 1, got {tool_slots}")
        self.cluster = cluster
        self.predictor = predictor
        self.observers = list(observers)
        self.tool_slots = tool_slots
        self._busy_slots = 0
        self._tool_queue: deque[tuple[str, str]] = deque()
        self._tool_started: dict[tuple[str, str], float] = {}
        self.runs: dict[str, _Run] = {}
        self.outcomes: list[WorkflowOutcome] = []
        self._state_at_release: dict[str, dict[str, ReplicaState]] = {}
        self._history: dict[tuple[str, str], tuple[float, int]] = {}  # (tenant, role) -> (sum log output, n)
        self._recent: dict[str, deque[CallFeatures]] = {}  # tenant -> its last released calls (idle state)
        cluster.on_done = self._on_call_done
        cluster.engine.on(WorkflowArrived, self._on_arrived)
        cluster.engine.on(ToolFinished, self._on_tool_finished)

    # ---- public surface ------------------------------------------------------------------
    def submit(self, workflows: Iterable[Workflow]) -> None:
        for w in workflows:
            self.cluster.engine.schedule(WorkflowArrived(time_s=w.arrival_s, workflow=w))

    def context(self, request_id: str) -> tuple[Workflow, ModelCall] | None:
        """The workflow and step a request stands for (``None``: not a workflow's)."""
        wid, _, sid = request_id.rpartition("/")
        run = self.runs.get(wid)
        if run is None:
            return None
        step = run.workflow.step(sid)
        return (run.workflow, step) if isinstance(step, ModelCall) else None

    def replica_state(self, replica_id: str) -> ReplicaState:
        r = self.cluster.state.replicas[replica_id]
        waiting = [*r.waiting, *r.preempted]
        mem = self.cluster.ledger.capacity_bytes(r.device_ids[0])
        kv = r.kv_tokens * r.kv_bytes_per_token
        return ReplicaState(len(waiting), len(r.prefilling) + r.num_decodes, kv / max(1.0, float(mem)),
                            sum(x.spec.prompt_tokens for x in waiting))

    def call_features(self, request: RequestSpec, state: ReplicaState) -> CallFeatures:
        ctx = self.context(request.request_id)
        if ctx is None:
            role, depth, uses, n = "request", 0, 0, 1
        else:
            w, step = ctx
            role, depth, uses, n = step.role, self.runs[w.workflow_id].depth[step.step_id], len(step.uses), len(w.steps)
        return CallFeatures(role, request.model, model_params_b(request.model), request.prompt_tokens, depth, uses, n,
                            self.history(request.tenant_id, role), state.queue_len, state.running, state.kv_frac,
                            state.queued_prompt_tokens)

    def probe(self, tenant_id: str) -> CallFeatures | None:
        """The tenant's typical call: of its last 32 released calls, the one with the median
        prompt (``None`` before any); its state fields are an idle replica's."""
        recent = self._recent.get(tenant_id)
        if not recent:
            return None
        ordered = sorted(recent, key=lambda f: (f.prompt_tokens, f.role))
        return ordered[len(ordered) // 2]

    def history(self, tenant_id: str, role: str) -> float:
        total, n = self._history.get((tenant_id, role), (0.0, 0))
        return total / n if n else 0.0

    def unloaded_p99(self, run: _Run) -> dict[str, float]:
        """p99 of every step's duration on an idle replica (tool: its duration), prompts from
        the true outputs of finished steps and the predicted p50 of the others; cached."""
        if run.p99_cost is not None:
            return run.p99_cost
        assert self.predictor is not None, "a predictor is needed"
        w = run.workflow

        def idle_call(s: ModelCall, prompt: int) -> CallFeatures:
            return self.call_features(RequestSpec(f"{w.workflow_id}/{s.step_id}", w.tenant_id, s.model, 0.0, prompt, 1),
                                      IDLE)

        cost = step_costs_p99(w, run.outputs, self.predictor, idle_call)
        run.p99_cost = cost
        return cost

    def latest_start(self, q: QueuedRequest) -> float | None:
        """The slack policy's key: deadline minus the p99 path from this step to the end."""
        wid, _, sid = q.request_id.rpartition("/")
        run = self.runs.get(wid)
        if run is None or self.predictor is None:
            return None
        path = run.workflow.critical_path(self.unloaded_p99(run), done=run.finished)
        return run.workflow.deadline_s - path[sid]

    def downstream_p99(self, request_id: str) -> tuple[float, float]:
        """(p99 path after this step, latest predicted p99 finish of the workflow's other
        in-flight branches including their downstream paths); both 0 for a plain request."""
        wid, _, sid = request_id.rpartition("/")
        run = self.runs.get(wid)
        if run is None or self.predictor is None:
            return 0.0, 0.0
        cost = self.unloaded_p99(run)
        path = run.workflow.critical_path(cost, done=run.finished)
        now = self.cluster.now_s
        others = 0.0
        for b, rel in run.released.items():
            if b == sid or b in run.finished:
                continue
            eta = run.eta99.get(b, rel + cost[b])
            others = max(others, max(eta, now) + path[b] - cost[b])
        return path[sid] - cost[sid], others

    def note_routed(self, request_id: str, replica_id: str, p99_finish_s: float) -> None:
        wid, _, sid = request_id.rpartition("/")
        run = self.runs.get(wid)
        if run is not None:
            run.eta99[sid] = p99_finish_s

    def unfinished(self, cutoff_s: float) -> list[WorkflowOutcome]:
        """Outcomes of the workflows still in flight (finish nan: late)."""
        return [self._outcome(run, math.nan) for run in self.runs.values()]

    # ---- handlers ------------------------------------------------------------------------
    def _on_arrived(self, ev: WorkflowArrived) -> list[Event]:
        w = ev.workflow
        if w.workflow_id in self.runs:
            raise ValueError(f"workflow {w.workflow_id} submitted twice")
        run = _Run(w, {s.step_id: len(s.uses) for s in w.steps}, w.successors(), w.depth())
        self.runs[w.workflow_id] = run
        return [e for sid in w.roots() for e in self._release(run, sid, ev.time_s)]

    def _release(self, run: _Run, sid: str, now: float) -> list[Event]:
        w = run.workflow
        run.released[sid] = now
        step = w.step(sid)
        prompt = w.prompt_tokens(sid, run.outputs)
        if isinstance(step, ToolCall):
            key = (w.workflow_id, sid)
            if self._busy_slots < self.tool_slots:
                return [self._start_tool(key, now)]
            self._tool_queue.append(key)
            return []
        ctx = MODEL_CONFIGS[step.model].max_seq_len
        out = step.output_tokens or step.max_output_tokens or 1
        if step.max_output_tokens is not None:
            out = min(out, step.max_output_tokens)
        out = max(1, min(out, ctx // 4))
        prompt = max(1, min(prompt, ctx - out))
        req = RequestSpec(f"{w.workflow_id}/{sid}", w.tenant_id, step.model, now, prompt, out, "batch")
        self._recent.setdefault(w.tenant_id, deque(maxlen=32)).append(self.call_features(req, IDLE))
        st = self.cluster.state
        self._state_at_release[req.request_id] = {
            rid: self.replica_state(rid) for rid in st.by_model.get(step.model, [])
            if st.replicas[rid].spec.tenant_id in (None, w.tenant_id)}
        return [RequestArrived(time_s=now, request=req)]

    def _start_tool(self, key: tuple[str, str], now: float) -> ToolFinished:
        self._busy_slots += 1
        self._tool_started[key] = now
        step = self.runs[key[0]].workflow.step(key[1])
        assert isinstance(step, ToolCall)
        return ToolFinished(time_s=now + (step.duration_s or 0.0), workflow_id=key[0], step_id=key[1])

    def _on_tool_finished(self, ev: ToolFinished) -> list[Event]:
        self._busy_slots -= 1
        key = (ev.workflow_id, ev.step_id)
        started = self._tool_started.pop(key)
        run = self.runs[ev.workflow_id]
        step = run.workflow.step(ev.step_id)
        assert isinstance(step, ToolCall)
        record = ToolRecord(ToolFeatures(step.tool, run.workflow.prompt_tokens(ev.step_id, run.outputs)),
                            ev.time_s - started)
        for obs in self.observers:
            obs.tool_finished(record)
        follow: list[Event] = []
        if self._tool_queue:
            follow.append(self._start_tool(self._tool_queue.popleft(), ev.time_s))
        return follow + self._step_done(run, ev.step_id, step.output_tokens, ev.time_s, "")

    def _on_call_done(self, outcome: RequestOutcome) -> list[Event]:
        wid, _, sid = outcome.request_id.rpartition("/")
        run = self.runs.get(wid)
        if run is None:
            return []
        states = self._state_at_release.pop(outcome.request_id, {})
        now = self.cluster.now_s
        if outcome.dropped:
            run.failed = True
            return self._step_done(run, sid, 0, now, "")
        step = run.workflow.step(sid)
        prompt = run.workflow.prompt_tokens(sid, run.outputs)
        req = RequestSpec(outcome.request_id, run.workflow.tenant_id, outcome.model, 0.0, max(1, prompt), 1)
        record = CallRecord(self.call_features(req, states.get(outcome.replica_id, IDLE)), outcome.num_output_tokens,
                            outcome.finish_s - run.released[sid])
        for obs in self.observers:
            obs.call_finished(record)
        key = (run.workflow.tenant_id, step.role)
        total, n = self._history.get(key, (0.0, 0))
        self._history[key] = (total + math.log(outcome.num_output_tokens), n + 1)
        return self._step_done(run, sid, outcome.num_output_tokens, now, outcome.replica_id)

    def _step_done(self, run: _Run, sid: str, output_tokens: int, now: float, replica_id: str) -> list[Event]:
        run.finished[sid] = now
        run.outputs[sid] = output_tokens
        run.replica[sid] = replica_id
        follow: list[Event] = []
        for nxt in run.succ[sid]:
            run.pending[nxt] -= 1
            if run.pending[nxt] == 0:
                follow += self._release(run, nxt, now)
        if len(run.finished) == len(run.workflow.steps):
            del self.runs[run.workflow.workflow_id]
            self.outcomes.append(self._outcome(run, now))
        return follow

    def _outcome(self, run: _Run, finish_s: float) -> WorkflowOutcome:
        w = run.workflow
        steps = tuple(StepTiming(s.step_id, s.kind, s.role, run.released.get(s.step_id, math.nan),
                                 run.finished.get(s.step_id, math.nan), run.replica.get(s.step_id, ""),
                                 run.outputs.get(s.step_id, 0)) for s in w.steps)
        return WorkflowOutcome(w.workflow_id, w.tenant_id, w.shape, w.arrival_s, finish_s, w.slo_s, run.failed, steps)


def latencies(outcomes: Sequence[WorkflowOutcome]) -> np.ndarray:
    """Workflow latencies, an unfinished workflow counted as infinitely late."""
    return np.array([o.latency_s if not math.isnan(o.finish_s) else math.inf for o in outcomes])
