"""Live workflows: a DAG of a tenant's model calls and tool calls run end to end
(``POST /v1/workflows``; the document: :mod:`service.domain.workflow`).

A step starts when every step it uses is done. A model call becomes an ordinary request of the
tenant (its project, quota and queue policy apply; written to Neo4j before it is queued), with
its prompt built from its template (``{inputs.X}`` is the text the submission gave for input X,
``{steps.Y}`` the text step Y produced) or, without one, from the inputs' and earlier outputs'
texts one after another; its output length is the model's own, capped by
``max_output_tokens``. A tool call runs as a process of its own on a CPU core
(:mod:`executor.tool`), for the duration the step declares, at most ``tool_slots`` at a time.
A failed step fails the workflow (its other running steps are cancelled); ``cancel`` cancels
the running steps (their requests are cancelled like any other, tool processes are killed) and
every step not yet started.

Every finished step is an observation for the distributional predictor
(:mod:`service.api.predictors`): a model call's features as known when its request was
submitted (runtime state included) with its output tokens and latency, a tool call's with its
duration. With a predictor, the slack policy's key of a step's request is the workflow's
deadline minus the predicted p99 of its critical path from that step on
(:meth:`WorkflowBook.latest_start`).

Each workflow is driven by one task; a task that raises marks its workflow failed with the
error and logs it (nothing dies silently). Workflows live in the service's memory: a restart
keeps the model calls' requests (in Neo4j) but not the workflow's own progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.api.predictors import IDLE, runtime_state
from service.api.records import TERMINAL, LiveRequest
from service.core.slack import step_costs_p99, workflow_latest_start
from service.core.tail import CallFeatures, TailPredictor, ToolFeatures
from service.domain.audit import SYSTEM, Actor
from service.domain.error import ConflictError, InvalidInputError, NotFoundError
from service.domain.workflow import ModelCall, ToolCall, Workflow

if TYPE_CHECKING:
    from service.api.service import LiveService

log = logging.getLogger("slicesched.workflows")

MAX_STEPS = 256
MAX_TOOL_S = 600.0
DEFAULT_MAX_OUTPUT = 64  # a model call with no cap of its own
MAX_LIVE_WORKFLOWS = 10_000  # kept in memory (finished ones are dropped oldest first)
STEP_STATES = ("pending", "running", "done", "failed", "cancelled")


@dataclass
class StepRun:
    step_id: str
    kind: str
    role: str
    status: str = "pending"
    request_id: str | None = None
    started_at: float | None = None  # epoch seconds
    finished_at: float | None = None
    text: str = ""
    output_tokens: int = 0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # a tool's cpu_s and digest; a call's ttft_s

    def public(self, t0: float) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 4)

        return {"step_id": self.step_id, "kind": self.kind, "role": self.role, "status": self.status,
                "request_id": self.request_id, "start_s": rel(self.started_at), "end_s": rel(self.finished_at),
                "duration_s": None if self.started_at is None or self.finished_at is None
                else round(self.finished_at - self.started_at, 4),
                "output_tokens": self.output_tokens, "text": self.text[:2000], "error": self.error,
                "detail": self.detail}


@dataclass
class WorkflowRun:
    workflow: Workflow
    project_id: str
    input_text: dict[str, str]
    created_at: float
    steps: dict[str, StepRun]
    status: str = "running"
    finished_at: float | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    tools: dict[str, asyncio.subprocess.Process] = field(default_factory=dict, repr=False)
    # predicted p99 cost per step, for (finished steps, predictor version): the slack keys' cache
    p99_cost: tuple[tuple[frozenset[str], int], dict[str, float]] | None = field(default=None, repr=False)

    @property
    def workflow_id(self) -> str:
        return self.workflow.workflow_id

    @property
    def tenant_id(self) -> str:
        return self.workflow.tenant_id

    def public(self) -> dict[str, Any]:
        e2e = None if self.finished_at is None else self.finished_at - self.created_at
        return {"workflow_id": self.workflow_id, "tenant_id": self.tenant_id, "project_id": self.project_id,
                "shape": self.workflow.shape, "status": self.status, "slo_s": self.workflow.slo_s,
                "created_at": self.created_at, "finished_at": self.finished_at, "e2e_s": e2e,
                "met_slo": None if e2e is None or self.status != "done" else e2e <= self.workflow.slo_s,
                "error": self.error,
                "steps": [self.steps[s.step_id].public(self.created_at) for s in self.workflow.order()]}


class WorkflowBook:
    """The service's live workflows, keyed ``(tenant, workflow id)``."""

    def __init__(self, svc: LiveService, *, tool_slots: int = 2, poll_s: float = 1.0) -> None:
        self.svc = svc
        self.runs: dict[tuple[str, str], WorkflowRun] = {}
        self._ends: dict[str, asyncio.Future[None]] = {}  # request id -> woken when it ends
        self._step_of: dict[str, tuple[WorkflowRun, ModelCall]] = {}  # a step's request id -> its step
        self.tool_slots = asyncio.Semaphore(max(1, tool_slots))
        self.poll_s = poll_s

    # ---- submission ----------------------------------------------------------------------------
    def check(self, workflow: Workflow, input_text: Mapping[str, str]) -> None:
        """What the live service needs beyond the document's own checks (a 400 naming the step)."""
        wid = workflow.workflow_id
        if len(workflow.steps) > MAX_STEPS:
            raise InvalidInputError(f"workflow {wid}: at most {MAX_STEPS} steps, got {len(workflow.steps)}")
        if (workflow.tenant_id, wid) in self.runs:
            raise ConflictError(f"workflow {wid!r} exists: choose another workflow_id")
        for name in input_text:
            if name not in workflow.inputs:
                raise InvalidInputError(f"workflow {wid}: input_text gives {name!r}, which is not among its inputs")
        for s in workflow.steps:
            where = f"workflow {wid}: step {s.step_id}"
            if isinstance(s, ModelCall):
                if f"{workflow.tenant_id}/{s.model}" not in self.svc.state.models:
                    raise InvalidInputError(f"{where}: tenant {workflow.tenant_id} has no model {s.model!r}")
            elif s.duration_s is None or not 0.0 <= s.duration_s <= MAX_TOOL_S:
                raise InvalidInputError(f"{where}: a live tool call declares its duration_s, in [0, {MAX_TOOL_S:g}]")

    def submit(self, actor: Actor, workflow: Workflow, project_id: str, input_text: Mapping[str, str]
               ) -> WorkflowRun:
        self.check(workflow, input_text)
        self._forget_finished()
        run = WorkflowRun(workflow, project_id, dict(input_text), self.svc.state.wall(),
                          {s.step_id: StepRun(s.step_id, s.kind, s.role) for s in workflow.steps})
        self.runs[(workflow.tenant_id, workflow.workflow_id)] = run
        run.task = asyncio.create_task(self._drive(run), name=f"workflow {workflow.workflow_id}")
        self.svc.audit.record(actor, "workflow.submit", "workflow", workflow.workflow_id,
                              tenant_id=workflow.tenant_id,
                              after={"steps": len(workflow.steps), "slo_s": workflow.slo_s, "project": project_id})
        return run

    def get(self, tenant_id: str | None, workflow_id: str) -> WorkflowRun:
        """The workflow (``tenant_id`` None: any tenant's); another tenant's is a 404."""
        if tenant_id is not None:
            run = self.runs.get((tenant_id, workflow_id))
            if run is not None:
                return run
        else:
            for (_, w), run in self.runs.items():
                if w == workflow_id:
                    return run
        raise NotFoundError(f"no workflow {workflow_id!r}")

    async def cancel(self, actor: Actor, run: WorkflowRun) -> None:
        if run.status != "running":
            raise ConflictError(f"workflow {run.workflow_id} is already {run.status}")
        run.status = "cancelled"
        self.svc.audit.record(actor, "workflow.cancel", "workflow", run.workflow_id, tenant_id=run.tenant_id)
        if run.task is not None:
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task
        await self._stop_steps(run, "cancelled")
        run.finished_at = run.finished_at or self.svc.state.wall()

    async def stop(self) -> None:
        for run in list(self.runs.values()):
            if run.task is not None and not run.task.done():
                run.task.cancel()
        for run in list(self.runs.values()):
            for proc in run.tools.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

    def _forget_finished(self) -> None:
        if len(self.runs) < MAX_LIVE_WORKFLOWS:
            return
        done = sorted((r.finished_at or 0.0, k) for k, r in self.runs.items() if r.status != "running")
        for _, key in done[: max(1, len(done) // 10)]:
            self.runs.pop(key, None)

    # ---- driving one workflow ------------------------------------------------------------------
    async def _drive(self, run: WorkflowRun) -> None:
        wf = run.workflow
        running: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                for s in wf.order():
                    st = run.steps[s.step_id]
                    if st.status == "pending" and all(run.steps[u].status == "done" for u in s.uses):
                        st.status, st.started_at = "running", self.svc.state.wall()
                        running[s.step_id] = asyncio.create_task(self._run_step(run, s))
                if not running:
                    break
                finished, _ = await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
                for step_id in [k for k, t in running.items() if t in finished]:
                    task = running.pop(step_id)
                    exc = task.exception()
                    if exc is not None:
                        st = run.steps[step_id]
                        st.status, st.error, st.finished_at = "failed", _describe(exc), self.svc.state.wall()
                    if run.steps[step_id].status == "failed":
                        raise StepFailed(step_id, run.steps[step_id].error or "failed")
            run.status = "done"
        except asyncio.CancelledError:
            await _cancel_all(running.values())  # tools' processes killed; requests: by _stop_steps
            raise
        except StepFailed as exc:
            run.status, run.error = "failed", f"step {exc.step_id}: {exc.reason}"
            await _cancel_all(running.values())
            await self._stop_steps(run, "cancelled")
        except Exception as exc:  # a bug here fails this workflow, never the service, and is logged
            log.exception("workflow %s of %s failed", run.workflow_id, run.tenant_id)
            run.status, run.error = "failed", _describe(exc)
            await self._stop_steps(run, "cancelled")
        run.finished_at = self.svc.state.wall()
        self.svc.audit.record(SYSTEM, f"workflow.{run.status}", "workflow", run.workflow_id,
                              tenant_id=run.tenant_id,
                              after={"e2e_s": run.finished_at - run.created_at, "error": run.error})

    async def _run_step(self, run: WorkflowRun, s: ModelCall | ToolCall) -> None:
        if isinstance(s, ModelCall):
            await self._model_call(run, s)
        else:
            await self._tool_call(run, s)

    def prompt_of(self, run: WorkflowRun, s: ModelCall) -> str:
        texts = {f"inputs.{k}": v for k, v in run.input_text.items()}
        texts |= {f"steps.{u}": run.steps[u].text for u in s.uses}
        if s.template is not None:
            out = s.template
            for key, value in texts.items():
                out = out.replace("{" + key + "}", value)
            return out
        own = f"[{s.role}] "
        parts = [run.input_text.get(i, f"<{i}>") for i in s.inputs] + [run.steps[u].text for u in s.uses]
        return own + "\n".join(p for p in parts if p) if parts else own.strip()

    async def _model_call(self, run: WorkflowRun, s: ModelCall) -> None:
        from service.api import intake

        svc = self.svc
        st = run.steps[s.step_id]
        model = svc.state.models.get(f"{run.tenant_id}/{s.model}")
        if model is None:
            raise InvalidInputError(f"model {s.model!r} is gone")
        prompt = model.tokenizer.encode(self.prompt_of(run, s)) or [32]
        req = intake.build_request(svc, run.tenant_id, s.model, prompt, s.max_output_tokens or DEFAULT_MAX_OUTPUT,
                                   project_id=run.project_id)
        wf = run.workflow
        features = svc.predictors.call_features(model, s.role, len(prompt), wf.depth()[s.step_id], len(s.uses),
                                                len(wf.steps), runtime_state(svc.state, model))
        self._step_of[req.request_id] = (run, s)  # before it is queued: the slack key asks for it
        try:
            (req,) = await svc.accept_requests([req])
            st.request_id = req.request_id
            await self._until_ended(req)  # a cancelled workflow cancels the request (_stop_steps)
        finally:
            self._step_of.pop(req.request_id, None)
        st.finished_at = svc.state.wall()
        st.output_tokens = len(req.output_tokens)
        st.text = model.tokenizer.decode(req.output_tokens)
        st.detail = {"prompt_tokens": len(prompt), "ttft_s": req.ttft_s, "queued_s": req.queued_s}
        if req.status == "done":
            st.status = "done"
            latency = req.e2e_s if req.e2e_s is not None else st.finished_at - req.arrival
            svc.predictors.observe_call(features, st.output_tokens, latency, tenant_id=run.tenant_id,
                                        workflow_id=run.workflow_id, step_id=s.step_id, at=st.finished_at)
        else:
            st.status, st.error = "failed", f"request {req.request_id} {req.status}: {req.error or ''}".strip()

    def latest_start(self, request_id: str, predictor: TailPredictor) -> float | None:
        """The slack key of a workflow step's request: the workflow's deadline (submission plus
        ``slo_s``, epoch seconds) minus the predicted p99 path from the step to the end (None: the
        request is no workflow's)."""
        ctx = self._step_of.get(request_id)
        if ctx is None:
            return None
        run, step = ctx
        done = frozenset(sid for sid, st in run.steps.items() if st.status == "done")
        version = self.svc.predictors.version
        if run.p99_cost is None or run.p99_cost[0] != (done, version):
            models = self.svc.state.models
            predictors = self.svc.predictors

            def features(s: ModelCall, prompt: int) -> CallFeatures:
                model = models[f"{run.tenant_id}/{s.model}"]
                return predictors.call_features(model, s.role, prompt, depth[s.step_id], len(s.uses),
                                                len(run.workflow.steps), IDLE)

            depth = run.workflow.depth()
            outputs = {sid: run.steps[sid].output_tokens for sid in done}
            run.p99_cost = ((done, version), step_costs_p99(run.workflow, outputs, predictor, features))
        return workflow_latest_start(run.workflow, step.step_id, run.p99_cost[1], done,
                                     run.created_at + run.workflow.slo_s)

    def request_ended(self, req: LiveRequest) -> None:
        """The service's end-of-request hook (on the event loop): wakes the step waiting for it."""
        fut = self._ends.pop(req.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _until_ended(self, req: LiveRequest) -> None:
        """Until ``req`` ends: woken by :meth:`request_ended`, and looking again every ``poll_s``
        in case an end reached the request by another way."""
        while req.status not in TERMINAL:
            fut = self._ends.setdefault(req.request_id, asyncio.get_running_loop().create_future())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), self.poll_s)
        self._ends.pop(req.request_id, None)

    async def _tool_call(self, run: WorkflowRun, s: ToolCall) -> None:
        st = run.steps[s.step_id]
        async with self.tool_slots:
            st.detail["waited_s"] = round(self.svc.state.wall() - (st.started_at or 0.0), 4)
            began = self.svc.state.wall()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "executor.tool", "--tool", s.tool, "--seconds", str(s.duration_s or 0.0),
                "--output-tokens", str(s.output_tokens), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            run.tools[s.step_id] = proc
            try:
                out, err = await proc.communicate()
            except asyncio.CancelledError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
            finally:
                run.tools.pop(s.step_id, None)
        st.finished_at = self.svc.state.wall()
        if proc.returncode != 0:
            st.status, st.error = "failed", f"tool {s.tool} exited {proc.returncode}: {err.decode()[-300:]}"
            return
        answer = json.loads(out.decode().strip().splitlines()[-1])
        st.text, st.output_tokens = str(answer["output"]), len(str(answer["output"]))
        st.detail |= {"tool": s.tool, "cpu_s": answer["cpu_s"], "wall_s": answer["wall_s"], "digest": answer["digest"]}
        st.status = "done"
        inputs = run.workflow.prompt_tokens(s.step_id, {u: run.steps[u].output_tokens for u in s.uses})
        self.svc.predictors.observe_tool(ToolFeatures(s.tool, inputs), st.finished_at - began, tenant_id=run.tenant_id,
                                         workflow_id=run.workflow_id, step_id=s.step_id, at=st.finished_at)

    async def _cancel_request(self, req: LiveRequest) -> None:
        from service.api import intake

        if req.status in TERMINAL:
            return
        try:
            await intake.cancel_request(self.svc, req)
        except ConflictError:
            pass  # it finished meanwhile
        except Exception:
            log.exception("could not cancel request %s of a cancelled workflow", req.request_id)

    async def _stop_steps(self, run: WorkflowRun, status: str) -> None:
        now = self.svc.state.wall()
        for st in run.steps.values():
            if st.status in ("pending", "running"):
                if st.request_id is not None:
                    req = self.svc.state.requests.get(st.request_id)
                    if req is not None:
                        await self._cancel_request(req)
                proc = run.tools.get(st.step_id)
                if proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                st.status, st.finished_at = status, now


class StepFailed(Exception):
    def __init__(self, step_id: str, reason: str) -> None:
        super().__init__(f"{step_id}: {reason}")
        self.step_id = step_id
        self.reason = reason


async def _cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    pending = list(tasks)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _describe(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"[:500]

