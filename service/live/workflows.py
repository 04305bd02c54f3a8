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
(:mod:`service.live.predictors`): a model call's features as known when its request was
submitted (runtime state included) with its output tokens and latency, a tool call's with its
duration. With a predictor, the slack policy's key of a step's request is the workflow's
deadline minus the predicted p99 of its critical path from that step on
(:meth:`WorkflowBook.latest_start`).

Each workflow is driven by one task; a task that raises marks its workflow failed with the
error and logs it (nothing dies silently).

Durability (the GMG: :mod:`service.graph.workflow_store`), in the style of requests: a workflow
is written to Neo4j (its validated document, inputs' texts, project, SLO, submit time, every
step pending) before it is answered 202; a step's start and its request id travel with the
batched GMG writer (soft: a whole snapshot with a version, so a late batch never undoes a newer
state); a step's end is written before its successors start, and a cancel before it is answered,
as is the workflow's end. A model call's request carries the idempotency key
``workflow:<workflow id>:<step id>``, so the call is made once whatever a restart forgot: at
start (:meth:`WorkflowBook.restore`) every running workflow resumes, a model step that had
started asks for its request again under that key and gets the one that exists (finished: its
result at once; queued or leased: waited for), a tool step that was running runs again from the
start (tools are idempotent CPU work: the re-run costs time, never a wrong result), and the
successors run as normal. Ended workflows are loaded too for the day requests are
(``RECOVER_FINISHED_S``), so they stay readable; a workflow cancelled before the restart stays
cancelled (its steps' requests still unfinished are cancelled then).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.core.slack import step_costs_p99, workflow_latest_start
from service.core.tail import CallFeatures, TailPredictor, ToolFeatures
from service.domain.audit import SYSTEM, Actor
from service.domain.error import ConflictError, DatabaseUnavailableError, InvalidInputError, NotFoundError
from service.domain.workflow import ModelCall, ToolCall, Workflow
from service.live.audit import AuditLog
from service.live.intake import Intake
from service.live.neo4j_gate import Neo4jGate
from service.live.predictors import IDLE, LivePredictors, runtime_state
from service.live.records import TERMINAL, LiveRequest, Write
from service.live.state import LiveState

log = logging.getLogger("slicesched.workflows")

MAX_STEPS = 256
MAX_TOOL_S = 600.0
DEFAULT_MAX_OUTPUT = 64  # a model call with no cap of its own
MAX_LIVE_WORKFLOWS = 10_000  # kept in memory (finished ones are dropped oldest first)
STEP_STATES = ("pending", "running", "done", "failed", "cancelled")
RETRY_S = 1.0  # between attempts of a durable write while Neo4j is down


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

    def row(self, workflow_uid: str) -> dict[str, Any]:
        """Its ``WorkflowStep`` properties that change (the full text: successors' prompts read it)."""
        return {"uid": f"{workflow_uid}/{self.step_id}", "status": self.status, "request_id": self.request_id,
                "started_at": self.started_at, "finished_at": self.finished_at, "text": self.text,
                "output_tokens": self.output_tokens, "error": self.error,
                "detail": json.dumps(self.detail, sort_keys=True)}

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> StepRun:
        return StepRun(str(row["step_id"]), str(row["kind"]), str(row["role"]), str(row.get("status") or "pending"),
                       row.get("request_id"), row.get("started_at"), row.get("finished_at"), str(row.get("text") or ""),
                       int(row.get("output_tokens") or 0), row.get("error"), json.loads(row.get("detail") or "{}"))


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
    version: int = 0  # of the last snapshot handed to Neo4j (a newer one always wins there)

    @property
    def uid(self) -> str:
        return f"{self.tenant_id}/{self.workflow_id}"

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

    def create_row(self) -> dict[str, Any]:
        """The ``Workflow`` node and its ``WorkflowStep`` nodes as accepted (``create_workflows``)."""
        wf = self.workflow
        row = self.snapshot()
        row["workflow"] |= {"tenant_id": self.tenant_id, "workflow_id": self.workflow_id,
                            "project_id": self.project_id, "shape": wf.shape, "slo_s": wf.slo_s,
                            "created_at": self.created_at, "document": json.dumps(wf.to_dict(), sort_keys=True),
                            "input_text": json.dumps(self.input_text, sort_keys=True)}
        for i, (st, s) in enumerate(zip(row["steps"], wf.order(), strict=True)):
            st |= {"tenant_id": self.tenant_id, "workflow_uid": self.uid, "step_id": s.step_id, "kind": s.kind,
                   "role": s.role, "position": i}
        return row

    def snapshot(self, status: str | None = None) -> dict[str, Any]:
        """Its state and every step's, with the next version (``update_workflows``); ``status``
        stands in for its own (a cancel written before memory changes)."""
        self.version += 1
        return {"workflow": {"uid": self.uid, "status": status or self.status, "version": self.version,
                             "finished_at": self.finished_at, "error": self.error},
                "steps": [self.steps[s.step_id].row(self.uid) for s in self.workflow.order()]}

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> WorkflowRun:
        """A workflow as Neo4j holds it (``live_workflows``); the document is checked again."""
        workflow = Workflow.from_dict(json.loads(row["document"]))
        steps = {str(s["step_id"]): StepRun.from_row(s) for s in row.get("steps") or []}
        missing = [s.step_id for s in workflow.steps if s.step_id not in steps]
        if missing:
            raise InvalidInputError(f"workflow {workflow.workflow_id}: steps {missing} are not in Neo4j")
        return WorkflowRun(workflow, str(row["project_id"]), dict(json.loads(row.get("input_text") or "{}")),
                           float(row["created_at"]), steps, str(row["status"]), row.get("finished_at"),
                           row.get("error"), version=int(row.get("version") or 0))


class WorkflowBook:
    """The service's live workflows, keyed ``(tenant, workflow id)``."""

    def __init__(self, gate: Neo4jGate, state: LiveState, audit: AuditLog, predictors: LivePredictors, intake: Intake,
                 accept: Callable[[list[LiveRequest]], Awaitable[list[LiveRequest]]],
                 persist: Callable[[Iterable[Write]], None], *, tool_slots: int = 2, poll_s: float = 1.0) -> None:
        self.gate, self.state, self.audit, self.predictors, self.intake = gate, state, audit, predictors, intake
        self.accept = accept  # requests written, then queued (DurableWrites.accept_requests)
        self.persist = persist  # soft writes for the GMG mirror
        self.runs: dict[tuple[str, str], WorkflowRun] = {}
        self._ends: dict[str, asyncio.Future[None]] = {}  # request id -> woken when it ends
        self._step_of: dict[str, tuple[WorkflowRun, ModelCall]] = {}  # a step's request id -> its step
        self.tool_slots = asyncio.Semaphore(max(1, tool_slots))
        self.poll_s = poll_s
        self._submitting: set[tuple[str, str]] = set()  # (tenant, workflow id) being written

    # ---- submission ----------------------------------------------------------------------------
    def check(self, workflow: Workflow, input_text: Mapping[str, str]) -> None:
        """What the live service needs beyond the document's own checks (a 400 naming the step)."""
        wid = workflow.workflow_id
        if len(workflow.steps) > MAX_STEPS:
            raise InvalidInputError(f"workflow {wid}: at most {MAX_STEPS} steps, got {len(workflow.steps)}")
        if (workflow.tenant_id, wid) in self.runs or (workflow.tenant_id, wid) in self._submitting:
            raise ConflictError(f"workflow {wid!r} exists: choose another workflow_id")
        for name in input_text:
            if name not in workflow.inputs:
                raise InvalidInputError(f"workflow {wid}: input_text gives {name!r}, which is not among its inputs")
        for s in workflow.steps:
            where = f"workflow {wid}: step {s.step_id}"
            if isinstance(s, ModelCall):
                if f"{workflow.tenant_id}/{s.model}" not in self.state.models:
                    raise InvalidInputError(f"{where}: tenant {workflow.tenant_id} has no model {s.model!r}")
            elif s.duration_s is None or not 0.0 <= s.duration_s <= MAX_TOOL_S:
                raise InvalidInputError(f"{where}: a live tool call declares its duration_s, in [0, {MAX_TOOL_S:g}]")

    async def submit(self, actor: Actor, workflow: Workflow, project_id: str, input_text: Mapping[str, str]
                     ) -> WorkflowRun:
        """Check it, write it to Neo4j, then run it: an answered workflow is never lost. A write
        that outlives its bound (503 to the client) still starts the workflow when it commits;
        an id Neo4j holds already (a workflow not loaded at start) is a 409."""
        assert self.gate.repo is not None
        self.check(workflow, input_text)
        self._forget_finished()
        run = WorkflowRun(workflow, project_id, dict(input_text), self.state.wall(),
                          {s.step_id: StepRun(s.step_id, s.kind, s.role) for s in workflow.steps})
        key = (workflow.tenant_id, workflow.workflow_id)
        created: list[bool] = []

        def settle(task: asyncio.Future[Any]) -> None:
            if created:
                return
            created.append(not task.cancelled() and task.exception() is None and run.uid in task.result())
            self._submitting.discard(key)
            if created[0]:
                self._start(run)
                self.audit.record(actor, "workflow.submit", "workflow", workflow.workflow_id,
                                 tenant_id=workflow.tenant_id,
                                 after={"steps": len(workflow.steps), "slo_s": workflow.slo_s, "project": project_id})

        self.gate.check()
        self._submitting.add(key)
        task = self.gate.in_thread(self.gate.repo.workflows.create_workflows, [run.create_row()])
        task.add_done_callback(settle)
        try:
            await self.gate.bounded(task, self.gate.settings.call_timeout_s)
        finally:
            if task.done():
                settle(task)
        if not created[0]:
            raise ConflictError(f"workflow {workflow.workflow_id!r} exists: choose another workflow_id")
        return run

    def _start(self, run: WorkflowRun) -> None:
        self.runs[(run.tenant_id, run.workflow_id)] = run
        run.task = asyncio.create_task(self._drive(run), name=f"workflow {run.workflow_id}")

    async def restore(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """At start, the workflows Neo4j holds (``live_workflows``): ended ones become readable
        again, running ones resume (module docstring: what each step does), and the steps a
        cancel or a failure left unfinished are cancelled, their requests too."""
        resumed = 0
        for row in rows:
            try:
                run = WorkflowRun.from_row(row)
            except (InvalidInputError, KeyError, ValueError, TypeError) as exc:
                log.error("workflow %s in Neo4j is not restored: %s", row.get("uid"), _describe(exc))
                continue
            if run.status != "running":
                self.runs[(run.tenant_id, run.workflow_id)] = run
                if run.finished_at is None or any(st.status in ("pending", "running") for st in run.steps.values()):
                    await self._stop_steps(run, "cancelled")
                    run.finished_at = run.finished_at or self.state.wall()
                    await self._commit(run)
                continue
            for st in run.steps.values():
                if st.status == "running":
                    st.status = "pending"  # started again by the drive: a model call re-attaches to its request
                    if st.kind == "tool":  # a tool runs again from the start (idempotent CPU work)
                        st.started_at, st.detail = None, {"reruns": int(st.detail.get("reruns", 0)) + 1}
            self._start(run)
            resumed += 1
            self.audit.record(SYSTEM, "workflow.resume", "workflow", run.workflow_id, tenant_id=run.tenant_id,
                                  details={"steps_done": sum(st.status == "done" for st in run.steps.values())})
        if resumed:
            log.info("resumed %d workflows from Neo4j", resumed)

    async def _commit(self, run: WorkflowRun, status: str | None = None) -> None:
        """Write its snapshot now (``status`` in place of its own), trying again every
        ``RETRY_S`` while Neo4j is down (what follows waits: successors start only after their
        inputs' ends are written)."""
        assert self.gate.repo is not None
        row = run.snapshot(status)
        while True:
            try:
                await self.gate.db(self.gate.repo.workflows.update_workflows, [row])
                return
            except DatabaseUnavailableError:
                await asyncio.sleep(RETRY_S)

    def _soft(self, run: WorkflowRun) -> None:
        """Its snapshot for the batched GMG writer (progress a restart may lose)."""
        self.persist([Write("workflow", {"uid": run.uid, "snapshot": run.snapshot()})])

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
        """Durable before it is answered: the cancel is written first (a 503 changes nothing),
        then the steps are stopped and their final state written."""
        assert self.gate.repo is not None
        if run.status != "running":
            raise ConflictError(f"workflow {run.workflow_id} is already {run.status}")
        for _ in range(3):  # a newer batched snapshot may land first and void this one: write a newer one
            if run.uid in await self.gate.db(self.gate.repo.workflows.update_workflows, [run.snapshot("cancelled")]):
                break
            if run.status != "running":
                raise ConflictError(f"workflow {run.workflow_id} is already {run.status}")
        else:
            raise ConflictError(f"workflow {run.workflow_id} has ended in Neo4j")
        run.status = "cancelled"
        self.audit.record(actor, "workflow.cancel", "workflow", run.workflow_id, tenant_id=run.tenant_id)
        if run.task is not None:
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task
        await self._stop_steps(run, "cancelled")
        run.finished_at = run.finished_at or self.state.wall()
        try:
            await self.gate.db(self.gate.repo.workflows.update_workflows, [run.snapshot()])
        except DatabaseUnavailableError:  # the cancel itself is written; the steps' state follows
            self._soft(run)

    async def stop(self) -> None:
        """The service stops: drives end where they are (nothing is cancelled: a restart resumes
        them), tool processes are killed."""
        tasks = [run.task for run in self.runs.values() if run.task is not None and not run.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
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
            for step_id, st in run.steps.items():  # restored with a failed step: its end was written, not the workflow's
                if st.status == "failed":
                    raise StepFailed(step_id, st.error or "failed")
            while True:
                started = False
                for s in wf.order():
                    st = run.steps[s.step_id]
                    if st.status == "pending" and all(run.steps[u].status == "done" for u in s.uses):
                        st.status, st.started_at = "running", st.started_at or self.state.wall()
                        running[s.step_id] = asyncio.create_task(self._run_step(run, s))
                        started = True
                if started:
                    self._soft(run)
                if not running:
                    break
                finished, _ = await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
                ended = [k for k, t in running.items() if t in finished]
                for step_id in ended:
                    task = running.pop(step_id)
                    exc = task.exception()
                    if exc is not None:
                        st = run.steps[step_id]
                        st.status, st.error, st.finished_at = "failed", _describe(exc), self.state.wall()
                for step_id in ended:
                    if run.steps[step_id].status == "failed":
                        raise StepFailed(step_id, run.steps[step_id].error or "failed")
                await self._commit(run)  # the ends are durable before any successor starts
            outcome = "done"
        except asyncio.CancelledError:
            await _cancel_all(running.values())  # tools' processes killed; requests: by _stop_steps
            raise
        except StepFailed as exc:
            outcome, run.error = "failed", f"step {exc.step_id}: {exc.reason}"
            await _cancel_all(running.values())
            await self._stop_steps(run, "cancelled")
        except Exception as exc:  # a bug here fails this workflow, never the service, and is logged
            log.exception("workflow %s of %s failed", run.workflow_id, run.tenant_id)
            outcome, run.error = "failed", _describe(exc)
            await self._stop_steps(run, "cancelled")
        run.finished_at = self.state.wall()
        await self._commit(run, outcome)  # memory says it ended only once Neo4j does
        if run.status != "running":  # a cancel won the race (it is written; this end was not)
            return
        run.status = outcome
        self.audit.record(SYSTEM, f"workflow.{run.status}", "workflow", run.workflow_id,
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
        st = run.steps[s.step_id]
        model = self.state.models.get(f"{run.tenant_id}/{s.model}")
        if model is None:
            raise InvalidInputError(f"model {s.model!r} is gone")
        prompt = model.tokenizer.encode(self.prompt_of(run, s)) or [32]
        max_tokens = s.max_output_tokens or DEFAULT_MAX_OUTPUT
        req = self.intake.build_request(run.tenant_id, s.model, prompt, max_tokens, project_id=run.project_id)
        # once per step, whatever a restart forgot: a second ask gets the request that exists
        req.idempotency_key = f"workflow:{run.workflow_id}:{s.step_id}"
        req.body_sha = hashlib.sha256(json.dumps([s.model, prompt, max_tokens]).encode()).hexdigest()
        wf = run.workflow
        features = self.predictors.call_features(model, s.role, len(prompt), wf.depth()[s.step_id], len(s.uses),
                                                len(wf.steps), runtime_state(self.state, model))
        self._step_of[req.request_id] = (run, s)  # before it is queued: the slack key asks for it
        try:
            (req,) = await self.accept([req])
            if st.request_id != req.request_id:
                st.request_id = req.request_id
                self._soft(run)
            await self._until_ended(req)  # a cancelled workflow cancels the request (_stop_steps)
        finally:
            self._step_of.pop(req.request_id, None)
        st.finished_at = req.finished_at or self.state.wall()
        st.output_tokens = len(req.output_tokens)
        st.text = model.tokenizer.decode(req.output_tokens)
        st.detail = {"prompt_tokens": len(prompt), "ttft_s": req.ttft_s, "queued_s": req.queued_s}
        if req.status == "done":
            st.status = "done"
            latency = req.e2e_s if req.e2e_s is not None else st.finished_at - req.arrival
            self.predictors.observe_call(features, st.output_tokens, latency, tenant_id=run.tenant_id,
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
        version = self.predictors.version
        if run.p99_cost is None or run.p99_cost[0] != (done, version):
            models = self.state.models
            predictors = self.predictors

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
            st.detail["waited_s"] = round(self.state.wall() - (st.started_at or 0.0), 4)
            began = self.state.wall()
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
        st.finished_at = self.state.wall()
        if proc.returncode != 0:
            st.status, st.error = "failed", f"tool {s.tool} exited {proc.returncode}: {err.decode()[-300:]}"
            return
        answer = json.loads(out.decode().strip().splitlines()[-1])
        st.text, st.output_tokens = str(answer["output"]), len(str(answer["output"]))
        st.detail |= {"tool": s.tool, "cpu_s": answer["cpu_s"], "wall_s": answer["wall_s"], "digest": answer["digest"]}
        st.status = "done"
        inputs = run.workflow.prompt_tokens(s.step_id, {u: run.steps[u].output_tokens for u in s.uses})
        self.predictors.observe_tool(ToolFeatures(s.tool, inputs), st.finished_at - began, tenant_id=run.tenant_id,
                                         workflow_id=run.workflow_id, step_id=s.step_id, at=st.finished_at)

    async def _cancel_request(self, req: LiveRequest) -> None:

        if req.status in TERMINAL:
            return
        try:
            await self.intake.cancel_request(req)
        except ConflictError:
            pass  # it finished meanwhile
        except Exception:
            log.exception("could not cancel request %s of a cancelled workflow", req.request_id)

    async def _stop_steps(self, run: WorkflowRun, status: str) -> None:
        now = self.state.wall()
        for st in run.steps.values():
            if st.status in ("pending", "running"):
                # by its key too: a request whose id a restart forgot (a lost batched write)
                rid = st.request_id or self.state.by_idempotency.get(
                    (run.tenant_id, f"workflow:{run.workflow_id}:{st.step_id}"))
                if rid is not None:
                    req = self.state.requests.get(rid)
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

