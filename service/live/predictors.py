"""The live service's distributional predictor: observations, online refits, calibration.

**Observations.** Every finished live workflow step is one record: a model call's
:class:`~service.core.tail.CallFeatures` as the service knew them when it submitted the step's
request (prompt, step type, position, the tenant's history, and the runtime state of the
model's queue then: waiting requests and their prompt tokens, running leases, KV in use) with
its measured output tokens and latency (arrival at the service to the last token); a tool
call's :class:`~service.core.tail.ToolFeatures` with its measured duration (its process's run,
after a CPU slot was free). They are appended to ``<state>/predictor/observations.jsonl``
(``SLICESCHED_OBSERVATIONS_FILE``) in the records format of ``slicesched predictors record``,
with the tenant, workflow, step and time besides, so ``slicesched predictors train`` reads live
and replay records alike; ``GET /v1/predictors/observations`` (admin) exports the file. A file
past 64 MiB is moved to ``observations.jsonl.1`` (one generation kept). Lines are written by a
worker thread about every second, never on the event loop.

**Online adaptation.** With ``--predictor DIR`` (a folder from ``predictors train``) or
``--predictor naive`` (the fixed :class:`~service.core.tail.NaivePredictor`) the service
predicts; without one (the default) nothing here predicts and the slack policy works as before.
The last ``window`` observations are kept (restored from the file at start). Every
``refit_s`` seconds, when at least ``min_new`` call observations are new, a worker thread
(tracked by :mod:`service.live.threads`, so a stop waits for it) trains a new model on all but
the newest fifth of them (fine-tuning a learned predictor, or fitting one from scratch when the
current one is the naive one) with seed ``seed + version``, measures its coverage of each
quantile on that newest fifth (held out; the model it replaces is measured on the same), and
swaps it in, on the event loop, as one assignment: a request's key is computed by the old or
the new model, never by a mix. A failed refit is logged with its traceback, counted and shown
(``GET /v1/predictors``, ``/metrics``, the ``predictor-refit`` loop in ``/readyz``); the old
model keeps answering.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from service.core.queue import QueuedRequest
from service.core.slack import request_latest_start
from service.core.tail import P99, QUANTILES, CallFeatures, NaivePredictor, TailPredictor, ToolFeatures
from service.domain.error import ConflictError, InvalidInputError
from service.domain.request import RequestStatus
from service.live import threads
from service.live.retention import observations_lock
from service.sim.iteration import kv_bytes_per_token
from service.sim.workflow import CallRecord, ToolRecord

if TYPE_CHECKING:
    from learned.distributional import DistributionalPredictor
    from service.domain.model_config import ModelConfig
    from service.live.records import LiveModel
    from service.live.state import LiveState

log = logging.getLogger("slicesched.predictors")

NAIVE = "naive"
MAX_FILE_BYTES = 64 * 1024 * 1024
HELD_OUT_SHARE = 5  # the newest 1/5 of the observations is held out of a refit, for its calibration
SCRATCH_EPOCHS = 30  # a first fit (from the naive predictor)
TUNE_EPOCHS = 3  # a fine-tune of a learned one


@dataclass(frozen=True, slots=True)
class PredictorSettings:
    """``source``: None (no predictor), ``naive``, or a folder written by ``predictors train``."""

    source: str | None = None
    refit_s: float = 300.0  # a refit is considered this often
    min_new: int = 50  # call observations new since the last refit, for a scheduled one
    window: int = 4000  # observations of each kind kept (and trained on)
    seed: int = 0  # a refit's seed is seed + the version it replaces


def params_b(config: ModelConfig) -> float:
    """A model's size in billions of parameters (as :func:`service.sim.workflow.model_params_b`)."""
    per_layer = 4 * config.d_model * config.d_model + 3 * config.d_model * config.d_ff
    return (config.n_layers * per_layer + 2 * config.vocab_size * config.d_model) / 1e9


@dataclass(frozen=True, slots=True)
class RuntimeState:
    """A model's queue and leases when a call joins it (the live counterpart of a sim replica's
    :class:`~service.sim.workflow.ReplicaState`)."""

    queue_len: int
    running: int
    kv_frac: float
    queued_prompt_tokens: int


IDLE = RuntimeState(0, 0, 0.0, 0)


def runtime_state(state: LiveState, model: LiveModel) -> RuntimeState:
    """Waiting requests of ``model`` and their prompt tokens, its running leases, and the KV its
    leases reserve over the KV set aside on its replicas' devices (0..1)."""
    queue = state.queues.get(model.uid)
    waiting = [state.requests[rid] for rid in queue] if queue is not None else []
    waiting = [r for r in waiting if r.status == RequestStatus.QUEUED]
    leased = [state.requests[lease.request_id] for lease in state.leases.values()
              if lease.request_id in state.requests and state.requests[lease.request_id].model_uid == model.uid]
    reserved = sum(state.kv_reserve_bytes(model) for r in state.replicas.values() if r.model_uid == model.uid)
    used = sum((len(r.prompt) + r.max_tokens) * kv_bytes_per_token(model.config) for r in leased)
    return RuntimeState(len(waiting), len(leased), min(1.0, used / reserved) if reserved else 0.0,
                        sum(len(r.prompt) for r in waiting))


def retrain(current: TailPredictor, calls: list[CallRecord], tools: list[ToolRecord], *,
            seed: int) -> tuple[DistributionalPredictor, dict[str, Any], dict[str, Any]]:
    """A new learned predictor from ``current`` and the observations (oldest first): trained on
    all but the newest fifth, measured on it. Returns ``(predictor, its calibration, the
    calibration of current on the same records)``. Deterministic for the records and ``seed``.
    Heavy (torch): run it in a worker thread."""
    from learned.distributional import DistributionalPredictor, OnlinePredictor, calibration, fit

    held_c, held_t = len(calls) // HELD_OUT_SHARE, len(tools) // HELD_OUT_SHARE
    train_c, test_c = calls[:len(calls) - held_c], calls[len(calls) - held_c:]
    train_t, test_t = tools[:len(tools) - held_t], tools[len(tools) - held_t:]
    if not train_c:
        raise ConflictError("no call observation to train on yet")
    if isinstance(current, DistributionalPredictor):
        # its own copy: the event loop keeps asking the current one (its cache is not shared)
        base = DistributionalPredictor(current.call_model, current.tool_model, current.vocab, current.y_shift,
                                       current.tool_shift)
        online = OnlinePredictor(base, window=max(1, len(train_c), len(train_t)), min_new=1, epochs=TUNE_EPOCHS,
                                 seed=seed)
        for c in train_c:
            online.observe_call(c.features, c.output_tokens, c.latency_s)
        for t in train_t:
            online.observe_tool(t.features, t.duration_s)
        online.refit()
        new = online.current
        before = calibration(base, test_c, test_t)
    else:
        new = fit(train_c, train_t, seed=seed, epochs=SCRATCH_EPOCHS, allow_no_tools=True)
        before = calibration(current, test_c, test_t)
    return new, calibration(new, test_c, test_t), before


def record_line(kind: str, record: CallRecord | ToolRecord, *, tenant_id: str, workflow_id: str, step_id: str,
                at: float) -> str:
    """One JSONL record (``predictors record``'s format plus where and when it was observed)."""
    doc: dict[str, Any] = {"kind": kind, "features": asdict(record.features)}
    if isinstance(record, CallRecord):
        doc |= {"output_tokens": record.output_tokens, "latency_s": record.latency_s}
    else:
        doc |= {"duration_s": record.duration_s}
    doc |= {"tenant_id": tenant_id, "workflow_id": workflow_id, "step_id": step_id, "at": at}
    return json.dumps(doc, separators=(",", ":")) + "\n"


class LivePredictors:
    """The service's predictor and its observations (module docstring). Mutated on the event
    loop only; training runs in worker threads on snapshots."""

    def __init__(self, settings: PredictorSettings, observations_file: Path) -> None:
        self.settings = settings
        self.path = observations_file
        self.predictor: TailPredictor | None = None  # None: no predictor (or not loaded yet)
        self.version = 0  # 1: the one loaded at start; +1 at each swap
        self.calls: deque[CallRecord] = deque(maxlen=settings.window)
        self.tools: deque[ToolRecord] = deque(maxlen=settings.window)
        self.new_calls = 0  # call observations since the last refit's snapshot
        self.recorded = {"call": 0, "tool": 0}  # observed by this process
        self.restored = 0
        self._lines: list[str] = []
        self._history: dict[tuple[str, str], tuple[float, int]] = {}  # (tenant, role) -> (sum log output, n)
        self._lock = asyncio.Lock()  # one refit at a time
        self.refits = 0
        self.failures = 0
        self.key_failures = 0
        self.last_error: str | None = None
        self.last_refit: dict[str, Any] | None = None
        self.last_refit_wall: float | None = None
        self.calibration: dict[str, Any] | None = None
        self.calibration_before: dict[str, Any] | None = None
        self.digest: str | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.source is not None

    @property
    def kind(self) -> str:
        if self.predictor is None:
            return "none"
        return "naive" if isinstance(self.predictor, NaivePredictor) else "learned"

    # ---- start and stop ----------------------------------------------------------------------
    async def start(self) -> None:
        """Load the configured predictor and the last ``window`` observations (worker threads)."""
        source = self.settings.source
        if source is not None:
            self.predictor = await threads.run(_load, source)
            self.version = 1
            self.digest = _digest(self.predictor)
        await threads.run(self._restore)

    def _restore(self) -> None:
        from learned.records import read_records

        if not self.path.is_file():
            return
        try:
            calls, tools = read_records(self.path)
        except InvalidInputError as exc:  # a damaged file is not fatal: new lines are still appended
            log.error("observations not restored: %s", exc)
            return
        self.calls.extend(calls[-self.settings.window:])
        self.tools.extend(tools[-self.settings.window:])
        self.restored = len(calls) + len(tools)
        for line in self.path.read_text().splitlines():  # the tenants' history of output lengths
            doc = json.loads(line) if line.strip() else {}
            if doc.get("kind") == "call" and doc.get("tenant_id"):
                self._note_history(str(doc["tenant_id"]), str(doc["features"]["role"]), int(doc["output_tokens"]))

    async def flush(self) -> None:
        """Append the observations not yet written (a worker thread)."""
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        try:
            await threads.run(_append, self.path, lines)
        except BaseException:
            self._lines = lines + self._lines  # written with the next flush
            raise

    def read_file(self, limit: int | None) -> str:
        """The observations file's text (its newest ``limit`` lines); empty before any."""
        if not self.path.is_file():
            return ""
        text = self.path.read_text()
        if limit is None:
            return text
        return "".join(text.splitlines(keepends=True)[-limit:])

    # ---- observations ------------------------------------------------------------------------
    def history(self, tenant_id: str, role: str) -> float:
        total, n = self._history.get((tenant_id, role), (0.0, 0))
        return total / n if n else 0.0

    def _note_history(self, tenant_id: str, role: str, output_tokens: int) -> None:
        total, n = self._history.get((tenant_id, role), (0.0, 0))
        self._history[(tenant_id, role)] = (total + math.log(max(1, output_tokens)), n + 1)

    def call_features(self, model: LiveModel, role: str, prompt_tokens: int, depth: int, num_uses: int,
                      workflow_steps: int, state: RuntimeState) -> CallFeatures:
        return CallFeatures(role, model.family, params_b(model.config), prompt_tokens, depth, num_uses,
                            workflow_steps, self.history(model.tenant_id, role), state.queue_len, state.running,
                            state.kv_frac, state.queued_prompt_tokens)

    def observe_call(self, features: CallFeatures, output_tokens: int, latency_s: float, *, tenant_id: str,
                     workflow_id: str, step_id: str, at: float) -> None:
        record = CallRecord(features, output_tokens, latency_s)
        self.calls.append(record)
        self.new_calls += 1
        self.recorded["call"] += 1
        self._note_history(tenant_id, features.role, output_tokens)
        self._lines.append(record_line("call", record, tenant_id=tenant_id, workflow_id=workflow_id,
                                       step_id=step_id, at=at))

    def observe_tool(self, features: ToolFeatures, duration_s: float, *, tenant_id: str, workflow_id: str,
                     step_id: str, at: float) -> None:
        record = ToolRecord(features, duration_s)
        self.tools.append(record)
        self.recorded["tool"] += 1
        self._lines.append(record_line("tool", record, tenant_id=tenant_id, workflow_id=workflow_id,
                                       step_id=step_id, at=at))

    # ---- refits ------------------------------------------------------------------------------
    async def refit_tick(self) -> None:
        """The scheduled refit: when ``min_new`` call observations are new."""
        if self.predictor is None or self.new_calls < self.settings.min_new:
            return
        await self.refit()

    async def refit(self) -> dict[str, Any]:
        """Train on a snapshot in a worker thread and swap the result in; answers the report.
        ``ConflictError`` without a predictor or without any call observation."""
        if self.predictor is None:
            raise ConflictError("the service runs without a predictor: start it with --predictor DIR|naive "
                                "(SLICESCHED_PREDICTOR)")
        async with self._lock:
            calls, tools, taken = list(self.calls), list(self.tools), self.new_calls
            if not calls:
                raise ConflictError("no call observation yet: a refit needs finished workflow model calls")
            current, seed = self.predictor, self.settings.seed + self.version
            started, wall = time.monotonic(), time.time()
            try:
                new, cal, before = await threads.run(retrain, current, calls, tools, seed=seed)
            except Exception as exc:
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.exception("predictor refit failed (failure %d); version %d keeps answering", self.failures,
                              self.version)
                raise
            self.predictor = new  # the swap: one assignment on the event loop
            self.version += 1
            self.new_calls = max(0, self.new_calls - taken)
            self.refits += 1
            self.last_error = None
            self.digest = _digest(new)
            self.calibration, self.calibration_before = cal, before
            self.last_refit_wall = wall
            self.last_refit = {"at": wall, "duration_s": round(time.monotonic() - started, 4), "seed": seed,
                               "from": "learned" if _digest(current) else "naive", "version": self.version,
                               "trained_calls": len(calls) - cal["num_calls"],
                               "trained_tools": len(tools) - cal["num_tools"],
                               "held_out_calls": cal["num_calls"], "held_out_tools": cal["num_tools"]}
            log.info("predictor refit: version %d on %d calls and %d tools in %.2fs", self.version, len(calls),
                     len(tools), self.last_refit["duration_s"])
            return self.last_refit

    # ---- predictions -------------------------------------------------------------------------
    def request_latest_start(self, q: QueuedRequest, model: LiveModel) -> float | None:
        """An independent request's latest start: its deadline minus its predicted p99 latency
        on an idle model (None without a predictor)."""
        pred = self.predictor
        if pred is None:
            return None
        f = self.call_features(model, "request", q.prompt_tokens, 0, 0, 1, IDLE)
        return request_latest_start(q.deadline_s, float(pred.call_quantiles([f])[0][1, P99]))

    def guarded(self, fn: Callable[[QueuedRequest], float | None]) -> Callable[[QueuedRequest], float | None]:
        """``fn`` that answers None (the slack policy's fallback) instead of raising: a predictor
        that fails must not refuse a request. Failures are logged and counted."""
        def key(q: QueuedRequest) -> float | None:
            try:
                return fn(q)
            except Exception:
                self.key_failures += 1
                log.exception("slack key of %s: the predictor failed; the token estimate decides", q.request_id)
                return None
        return key

    # ---- reports -----------------------------------------------------------------------------
    def public(self) -> dict[str, Any]:
        s = self.settings
        return {"enabled": self.enabled, "source": s.source, "kind": self.kind, "version": self.version,
                "digest": self.digest, "refit_interval_s": s.refit_s, "min_new": s.min_new, "window": s.window,
                "seed": s.seed,
                "observations": {"calls": len(self.calls), "tools": len(self.tools), "new_calls": self.new_calls,
                                 "recorded_calls": self.recorded["call"], "recorded_tools": self.recorded["tool"],
                                 "restored": self.restored, "unwritten": len(self._lines), "file": str(self.path)},
                "refits": self.refits, "refit_failures": self.failures, "key_failures": self.key_failures,
                "last_error": self.last_error, "last_refit": self.last_refit,
                "calibration": self.calibration, "calibration_before": self.calibration_before}

    def metrics(self, prefix: str) -> Iterator[Metric]:
        p = prefix
        yield GaugeMetricFamily(f"{p}predictor_version", "Version of the predictor answering (0: none; 1: the "
                                "one loaded at start; +1 per refit swapped in)", value=self.version)
        obs = GaugeMetricFamily(f"{p}predictor_observations", "Observations kept for refits (the window)",
                                labels=["kind"])
        obs.add_metric(["call"], len(self.calls))
        obs.add_metric(["tool"], len(self.tools))
        yield obs
        rec = CounterMetricFamily(f"{p}predictor_observations_recorded", "Finished workflow steps recorded by "
                                  "this process", labels=["kind"])
        rec.add_metric(["call"], self.recorded["call"])
        rec.add_metric(["tool"], self.recorded["tool"])
        yield rec
        yield CounterMetricFamily(f"{p}predictor_refits", "Refits swapped in", value=self.refits)
        yield CounterMetricFamily(f"{p}predictor_refit_failures", "Refits that failed (the old model kept "
                                  "answering)", value=self.failures)
        yield CounterMetricFamily(f"{p}predictor_key_failures", "Slack keys the predictor failed to give (the "
                                  "token estimate decided)", value=self.key_failures)
        if self.last_refit_wall is not None:
            yield GaugeMetricFamily(f"{p}predictor_last_refit_age_seconds", "Seconds since the last refit swapped "
                                    "in", value=max(0.0, time.time() - self.last_refit_wall))
        cov = GaugeMetricFamily(f"{p}predictor_coverage", "Share of held-out observations at or below each "
                                "predicted quantile at the last refit (a calibrated q covers q)",
                                labels=["target", "quantile"])
        for target in ("output_tokens", "latency_s", "tool_duration_s"):
            values = (self.calibration or {}).get(target)
            if values:
                for q, v in zip(QUANTILES, values, strict=True):
                    cov.add_metric([target, f"{q:g}"], float(v))
        yield cov


def _load(source: str) -> TailPredictor:
    if source == NAIVE:
        return NaivePredictor()
    from learned.distributional import DistributionalPredictor

    try:
        return DistributionalPredictor.load(Path(source))
    except InvalidInputError:
        raise
    except Exception as exc:  # a folder that has meta.json but no usable weights
        raise InvalidInputError(f"predictor {source}: cannot be loaded ({type(exc).__name__}: {exc}); "
                                "train one with `slicesched predictors train`", culprit=source) from None


def _digest(pred: TailPredictor) -> str | None:
    fn = getattr(pred, "digest", None)
    return str(fn()) if callable(fn) else None


def _append(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with observations_lock(path):  # retention rewrites the file under the same lock
        if path.exists() and path.stat().st_size > MAX_FILE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
        with path.open("a") as f:
            f.writelines(lines)
