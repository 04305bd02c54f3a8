"""Agentic workflows: a DAG of model calls and tool calls with one end-to-end SLO.

Pure data with validation; no I/O. A :class:`Workflow` is built from a JSON document
(:meth:`Workflow.from_dict`, what ``POST /v1/workflows`` accepts) or by a generator
(:mod:`service.workload.workflows`) and is turned back into the same document by
:meth:`Workflow.to_dict` (``from_dict(to_dict(w)) == w``). Every check raises
``InvalidInputError`` naming the culprit, before anything is built: duplicate step ids, a step
that uses an unknown step, a step that reads an input the workflow does not give, a cycle (its
steps named in order, ``a -> b -> a``), bad sizes, unknown keys.

The JSON shape (``?`` marks an optional key, with its default)::

    {
      "workflow_id": "wf-1",                 # unique per tenant
      "tenant_id": "acme",
      "arrival_s"?: 0.0,                     # replay: seconds from t=0; live: set by the service
      "slo_s": 120.0,                        # end-to-end deadline, arrival to last step done (> 0)
      "shape"?: "",                          # free label: "code-generation", "deep-research", ...
      "inputs"?: {"task": 812},              # workflow input name -> its size in tokens (>= 0)
      "steps": [                             # any order; the edges are `uses`
        {"step_id": "plan", "kind": "model", "role": "planner", "model": "coder-llm",
         "prompt_tokens": 200,               # the step's own instructions (>= 0)
         "inputs"?: ["task"],                # workflow inputs pasted into the prompt
         "uses"?: [],                        # earlier steps: it runs when they are done; their
                                             # outputs are pasted into the prompt
         "template"?: "Plan {inputs.task}",  # live: prompt text; {inputs.X} / {steps.Y} must be
                                             # declared in inputs / uses
         "max_output_tokens"?: null,         # a cap (>= 1), null: none
         "output_tokens"?: null},            # the true length: replay traces only (null live)
        {"step_id": "run", "kind": "tool", "role": "code-exec", "tool": "python",
         "uses": ["plan"], "inputs"?: [],
         "output_tokens"?: 0,                # tokens of its result, pasted into later prompts
         "duration_s"?: null}                # the true duration: replay traces only
      ]
    }

A model call's prompt is its own ``prompt_tokens`` plus the sizes of the inputs it reads plus
the outputs of the steps it uses (:meth:`Workflow.prompt_tokens`). Its output length is
unknown until it runs: ``output_tokens`` is a trace's truth, which only the simulator reads.
The ``role`` is the step type the predictors learn from (planner, coder, reviewer, search,
read, summarise, preprocess, vlm, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.domain.error import InvalidInputError

__all__ = ["STEP_KINDS", "ModelCall", "Step", "ToolCall", "Workflow", "find_cycle"]

StepKind = Literal["model", "tool"]
STEP_KINDS: tuple[StepKind, ...] = ("model", "tool")
_PLACEHOLDER = re.compile(r"\{(inputs|steps)\.([^{}]+)\}")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def _err(message: str, culprit: str) -> InvalidInputError:
    return InvalidInputError(message, culprit=culprit)


@dataclass(frozen=True, slots=True)
class ModelCall:
    """A call of a tenant's model: prompt from its own tokens, inputs and earlier outputs."""

    step_id: str
    role: str
    model: str
    prompt_tokens: int = 0  # the step's own instruction tokens
    uses: tuple[str, ...] = ()  # steps that must be done first; their outputs join the prompt
    inputs: tuple[str, ...] = ()  # workflow inputs pasted into the prompt
    template: str | None = None  # live: the prompt text with {inputs.X} / {steps.Y} placeholders
    max_output_tokens: int | None = None  # a cap; None: none
    output_tokens: int | None = None  # the true output length (replay traces only)
    kind: StepKind = field(default="model", init=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """CPU work (code execution, retrieval, image preprocessing) run by a tool executor."""

    step_id: str
    role: str
    tool: str
    uses: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    output_tokens: int = 0  # tokens of its result, pasted into the prompts of steps that use it
    duration_s: float | None = None  # the true duration (replay traces only)
    kind: StepKind = field(default="tool", init=False)


Step = ModelCall | ToolCall

_MODEL_KEYS = frozenset({"step_id", "kind", "role", "model", "prompt_tokens", "uses", "inputs", "template",
                         "max_output_tokens", "output_tokens"})
_TOOL_KEYS = frozenset({"step_id", "kind", "role", "tool", "uses", "inputs", "output_tokens", "duration_s"})
_WORKFLOW_KEYS = frozenset({"workflow_id", "tenant_id", "arrival_s", "slo_s", "shape", "inputs", "steps"})


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of the graph ``node -> nodes it uses`` as ``[a, b, ..., a]`` in dependency order
    (``a`` uses ``b``), or ``None``. Deterministic: nodes are visited in the mapping's order."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in edges:
        if state.get(root):
            continue
        path: list[str] = [root]
        iters = [iter(edges.get(root, ()))]
        state[root] = 1
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
                continue
            seen = state.get(nxt, 0)
            if seen == 1:
                return [*path[path.index(nxt):], nxt]
            if seen == 0 and nxt in edges:
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(edges[nxt]))
    return None


@dataclass(frozen=True, slots=True)
class Workflow:
    """A validated DAG of steps (see the module docstring). ``steps`` keep their given order;
    :meth:`order` is a topological order (dependencies first, ties in the given order)."""

    workflow_id: str
    tenant_id: str
    slo_s: float
    steps: tuple[Step, ...]
    arrival_s: float = 0.0
    inputs: Mapping[str, int] = field(default_factory=dict)
    shape: str = ""

    def __post_init__(self) -> None:
        wid = self.workflow_id
        if not isinstance(wid, str) or not _ID.match(wid):
            raise _err(f"workflow id must be 1-128 letters, digits or _.:-, got {wid!r}", str(wid))
        if not isinstance(self.tenant_id, str) or not self.tenant_id:
            raise _err(f"workflow {wid}: tenant_id must be a non-empty string", wid)
        if not (self.slo_s > 0.0) or math.isinf(self.slo_s):
            raise _err(f"workflow {wid}: slo_s must be finite and > 0, got {self.slo_s}", wid)
        if not (self.arrival_s >= 0.0) or math.isinf(self.arrival_s):
            raise _err(f"workflow {wid}: arrival_s must be finite and >= 0, got {self.arrival_s}", wid)
        for name, size in self.inputs.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise _err(f"workflow {wid}: input {name!r} must be a token count >= 0, got {size!r}", name)
        if not self.steps:
            raise _err(f"workflow {wid}: needs at least one step", wid)
        ids: set[str] = set()
        for s in self.steps:
            if not isinstance(s.step_id, str) or not _ID.match(s.step_id):
                raise _err(f"workflow {wid}: step id must be 1-128 letters, digits or _.:-, got {s.step_id!r}",
                           str(s.step_id))
            if s.step_id in ids:
                raise _err(f"workflow {wid}: duplicate step id {s.step_id!r}", s.step_id)
            ids.add(s.step_id)
        for s in self.steps:
            self._check_step(s, ids)
        cycle = find_cycle({s.step_id: s.uses for s in self.steps})
        if cycle is not None:
            raise _err(f"workflow {wid}: steps form a cycle: {' -> '.join(cycle)}", cycle[0])

    def _check_step(self, s: Step, ids: set[str]) -> None:
        where = f"workflow {self.workflow_id}: step {s.step_id}"
        if not s.role:
            raise _err(f"{where}: role must be a non-empty string", s.step_id)
        if len(set(s.uses)) != len(s.uses):
            raise _err(f"{where}: uses a step twice ({', '.join(s.uses)})", s.step_id)
        for u in s.uses:
            if u not in ids:
                raise _err(f"{where}: uses unknown step {u!r}", u)
        for name in s.inputs:
            if name not in self.inputs:
                known = ", ".join(sorted(self.inputs)) or "none"
                raise _err(f"{where}: reads input {name!r}, which the workflow does not give (inputs: {known})", name)
        if isinstance(s, ModelCall):
            if not s.model:
                raise _err(f"{where}: a model call needs a model", s.step_id)
            if s.prompt_tokens < 0:
                raise _err(f"{where}: prompt_tokens must be >= 0, got {s.prompt_tokens}", s.step_id)
            for name, value in (("max_output_tokens", s.max_output_tokens), ("output_tokens", s.output_tokens)):
                if value is not None and value < 1:
                    raise _err(f"{where}: {name} must be >= 1, got {value}", s.step_id)
            for ns, ref in _PLACEHOLDER.findall(s.template or ""):
                declared = s.inputs if ns == "inputs" else s.uses
                if ref not in declared:
                    raise _err(f"{where}: template refers to {{{ns}.{ref}}}, not declared in its {ns}", ref)
        else:
            if not s.tool:
                raise _err(f"{where}: a tool call needs a tool", s.step_id)
            if s.output_tokens < 0:
                raise _err(f"{where}: output_tokens must be >= 0, got {s.output_tokens}", s.step_id)
            if s.duration_s is not None and (not (s.duration_s >= 0.0) or math.isinf(s.duration_s)):
                raise _err(f"{where}: duration_s must be finite and >= 0, got {s.duration_s}", s.step_id)
        if self.prompt_tokens_bound(s) > 10**8:
            raise _err(f"{where}: prompt larger than 1e8 tokens", s.step_id)

    def prompt_tokens_bound(self, s: Step) -> int:
        """The prompt tokens known before any step runs (own plus inputs)."""
        own = s.prompt_tokens if isinstance(s, ModelCall) else 0
        return own + sum(self.inputs[i] for i in s.inputs if i in self.inputs)

    # ---- structure ---------------------------------------------------------------------------
    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.step_id == step_id:
                return s
        raise InvalidInputError(f"workflow {self.workflow_id}: no step {step_id!r}", culprit=step_id)

    def order(self) -> list[Step]:
        """The steps in a topological order: every step after the steps it uses."""
        done: set[str] = set()
        out: list[Step] = []
        pending = list(self.steps)
        while pending:
            rest = []
            for s in pending:
                if all(u in done for u in s.uses):
                    out.append(s)
                    done.add(s.step_id)
                else:
                    rest.append(s)
            pending = rest
        return out

    def successors(self) -> dict[str, list[str]]:
        """step id -> the steps that use it, in step order."""
        out: dict[str, list[str]] = {s.step_id: [] for s in self.steps}
        for s in self.steps:
            for u in s.uses:
                out[u].append(s.step_id)
        return out

    def roots(self) -> list[str]:
        """Steps that use no other step: released at arrival."""
        return [s.step_id for s in self.steps if not s.uses]

    def depth(self) -> dict[str, int]:
        """step id -> its position: 0 for a root, else 1 + the deepest step it uses."""
        out: dict[str, int] = {}
        for s in self.order():
            out[s.step_id] = 1 + max((out[u] for u in s.uses), default=-1)
        return out

    def prompt_tokens(self, step_id: str, outputs: Mapping[str, int]) -> int:
        """A model call's prompt: its own tokens, its inputs and the outputs (``outputs``: step id
        -> output tokens) of the steps it uses; a tool call's input size, the same way."""
        s = self.step(step_id)
        return self.prompt_tokens_bound(s) + sum(outputs.get(u, 0) for u in s.uses)

    def critical_path(self, cost: Mapping[str, float], done: Iterable[str] = ()) -> dict[str, float]:
        """step id -> the longest path of ``cost`` from the start of that step to the end of
        the workflow (its own cost included); steps in ``done`` cost 0."""
        finished = set(done)
        succ = self.successors()
        out: dict[str, float] = {}
        for s in reversed(self.order()):
            own = 0.0 if s.step_id in finished else cost.get(s.step_id, 0.0)
            out[s.step_id] = own + max((out[n] for n in succ[s.step_id]), default=0.0)
        return out

    @property
    def deadline_s(self) -> float:
        return self.arrival_s + self.slo_s

    # ---- documents ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON document (module docstring); optional keys at their default are left out."""
        steps: list[dict[str, Any]] = []
        for s in self.steps:
            d: dict[str, Any] = {"step_id": s.step_id, "kind": s.kind, "role": s.role}
            if isinstance(s, ModelCall):
                d |= {"model": s.model, "prompt_tokens": s.prompt_tokens}
                if s.template is not None:
                    d["template"] = s.template
                if s.max_output_tokens is not None:
                    d["max_output_tokens"] = s.max_output_tokens
            else:
                d |= {"tool": s.tool}
                if s.duration_s is not None:
                    d["duration_s"] = s.duration_s
            if s.uses:
                d["uses"] = list(s.uses)
            if s.inputs:
                d["inputs"] = list(s.inputs)
            if s.output_tokens:
                d["output_tokens"] = s.output_tokens
            steps.append(d)
        doc: dict[str, Any] = {"workflow_id": self.workflow_id, "tenant_id": self.tenant_id,
                               "arrival_s": self.arrival_s, "slo_s": self.slo_s}
        if self.shape:
            doc["shape"] = self.shape
        if self.inputs:
            doc["inputs"] = dict(self.inputs)
        doc["steps"] = steps
        return doc

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> Workflow:
        """Parse and validate a document (module docstring); ``InvalidInputError`` naming the
        first problem: a missing or unknown key, a wrong type, or any check of the DAG."""
        if not isinstance(doc, Mapping):
            raise InvalidInputError(f"a workflow is a JSON object, got {type(doc).__name__}")
        wid = str(doc.get("workflow_id", "?"))
        _keys(doc, _WORKFLOW_KEYS, {"workflow_id", "tenant_id", "slo_s", "steps"}, f"workflow {wid}")
        steps_doc = doc["steps"]
        if not isinstance(steps_doc, list):
            raise _err(f"workflow {wid}: steps must be a list", wid)
        inputs = doc.get("inputs", {})
        if not isinstance(inputs, Mapping):
            raise _err(f"workflow {wid}: inputs must be an object of name -> tokens", wid)
        return Workflow(workflow_id=_str(doc, "workflow_id", "workflow"), tenant_id=_str(doc, "tenant_id", wid),
                        slo_s=_num(doc, "slo_s", wid), steps=tuple(_step(x, wid) for x in steps_doc),
                        arrival_s=_num(doc, "arrival_s", wid, 0.0), inputs=dict(inputs),
                        shape=_str(doc, "shape", wid, ""))


def _keys(doc: Mapping[str, Any], allowed: frozenset[str], required: set[str], where: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise _err(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(allowed))})",
                   unknown[0])
    missing = sorted(required - set(doc))
    if missing:
        raise _err(f"{where}: missing key(s) {', '.join(map(repr, missing))}", missing[0])


def _str(doc: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str):
        raise _err(f"{where}: {key} must be a string, got {value!r}", key)
    return value


def _num(doc: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _err(f"{where}: {key} must be a number, got {value!r}", key)
    return float(value)


def _int(doc: Mapping[str, Any], key: str, where: str, default: int | None) -> int | None:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(f"{where}: {key} must be an integer, got {value!r}", key)
    return value


def _names(doc: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise _err(f"{where}: {key} must be a list of strings, got {value!r}", key)
    return tuple(value)


def _step(doc: Any, wid: str) -> Step:
    if not isinstance(doc, Mapping):
        raise _err(f"workflow {wid}: each step is a JSON object, got {doc!r}", wid)
    sid = str(doc.get("step_id", "?"))
    where = f"workflow {wid}: step {sid}"
    kind = doc.get("kind")
    if kind not in STEP_KINDS:
        raise _err(f"{where}: kind must be one of {', '.join(STEP_KINDS)}, got {kind!r}", sid)
    if kind == "model":
        _keys(doc, _MODEL_KEYS, {"step_id", "kind", "role", "model"}, where)
        template = doc.get("template")
        if template is not None and not isinstance(template, str):
            raise _err(f"{where}: template must be a string", sid)
        return ModelCall(step_id=_str(doc, "step_id", where), role=_str(doc, "role", where),
                         model=_str(doc, "model", where), prompt_tokens=_int(doc, "prompt_tokens", where, 0) or 0,
                         uses=_names(doc, "uses", where), inputs=_names(doc, "inputs", where), template=template,
                         max_output_tokens=_int(doc, "max_output_tokens", where, None),
                         output_tokens=_int(doc, "output_tokens", where, None))
    _keys(doc, _TOOL_KEYS, {"step_id", "kind", "role", "tool"}, where)
    duration = doc.get("duration_s")
    return ToolCall(step_id=_str(doc, "step_id", where), role=_str(doc, "role", where), tool=_str(doc, "tool", where),
                    uses=_names(doc, "uses", where), inputs=_names(doc, "inputs", where),
                    output_tokens=_int(doc, "output_tokens", where, 0) or 0,
                    duration_s=None if duration is None else _num(doc, "duration_s", where))
