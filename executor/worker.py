"""The executor's torch side: leases in, completions out, no network.

:class:`Worker` runs each lease's request in the continuous batcher of its replica: one
:class:`~executor.batcher.ContinuousBatcher` per replica; a model is built (or, from a model
directory, loaded) once per ``(family, seed, path, stages)`` and stays resident; a replica's
batcher is built on a builder thread, so that loading one does not stall the others. The new tokens
of streaming leases are collected after each round (:meth:`Worker.progress`). It is driven
from one thread (the daemon's main thread, :mod:`executor.daemon`).

Sharing the executor
    An executor runs one iteration at a time, so its replicas share its time, and they share it
    by measured time, not by iterations: stepping every replica once per round would give a
    model whose iterations cost ten times more ten times the share. Each batcher has a virtual
    time, its busy seconds divided by its weight; a round makes as many picks as there are
    non-idle batchers, each the non-idle one with the least virtual time (weighted fair
    queueing, as an OS scheduler shares a core). A batcher that wakes from idle starts at the
    least virtual time of the busy ones, so idling banks no credit.

    A batcher's weight is its role's over the tightest TPOT target of the leases it holds
    (``Lease.tpot_s``, in seconds; :data:`DEFAULT_TPOT_S` where none is given): an owner's role
    weighs 1 and a guest replica's (``Lease.guest``: placed on other tenants' devices)
    ``guest_weight``. So a guest fills the owners' idle time and, among replicas of equal
    targets, takes ``guest_weight / (owners busy + guest_weight)`` of the time while they are
    busy; and an interactive request (0.1 s) claims ten times the time of a batch one (1 s),
    whose backlog would otherwise hold its tokens back. Equal weights and equal costs are plain
    round robin. (A guest weighing as an owner, 1, was measured on the live demo and was no
    better: the light tenants' guests on the saturated tenant's own executor then took more of
    it; benchmarks/results/live_e2e-guest-weight-1.json.)

    Fair by time alone, a batcher with cheap iterations and a loose target would spin far ahead
    of it (a standard tenant's small model made a token every 4 ms against its 200 ms while an
    interactive guest beside it missed its 100 ms). So a batcher is *due* once
    :data:`TPOT_PACE` of its tightest target has passed since its last iteration began, or at
    once while a request of its waits for its prefill or while half its KV slots or more are
    taken (:attr:`~executor.batcher.ContinuousBatcher.pressed`: the service leases a replica
    no more than its slots, so a filling batch's queue waits at the service, where pacing would
    hold it back; measured live, a standard tenant's batch paced at 100 ms a token queued nine
    requests past their TTFT target); when any batcher is due, the picks are among the due
    ones. A batcher
    ahead of its pace still runs whenever none is due, so no time is left idle, and a tenant's
    cheap iterations then batch more requests at once instead of taking time from the others.
    A sliced guest under owner priority (``Lease.yields``: placement ``slice``) runs only in the
    owners' gaps: while any other batcher is due or admitting, it is not picked; and its layers
    on another node run there under that node's :attr:`Worker.compute_lock`, which the node's
    owners hold through each iteration, so an owner waits for at most one guest stage.
    Before all of these, a batcher with a request waiting for its prefill and a free KV slot
    (:attr:`~executor.batcher.ContinuousBatcher.admitting`) is picked first: that request's TTFT
    is running, and one iteration admits all that wait, so this claims at most one pick a round.
    (By virtual time alone, measured live, a standard tenant's 1 ms iterations, its batch half
    full and so due, ran 0.2 s ahead of a guest's first requests after the guest's costly
    prefill.)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from executor.batcher import Clock, ContinuousBatcher, GenerationRequest
from executor.device import torch_device
from executor.runner import Stage, StagedModel, check_stages, load_staged
from executor.settings import GUEST_WEIGHT
from executor.slices import (
    DEFAULT_SLICE_BUDGET_S,
    Builder,
    ComputeUnitQueue,
    GuestLayers,
    SliceAssignment,
    SliceResult,
    StreamSelector,
    build_slice_layers,
)
from service.domain.sampling import GREEDY, Sampling
from service.domain.wire import Completion, Failure, LeaseGrant, ProgressUpdate

log = logging.getLogger("slicesched.executor")

ITERATION_HISTORY = 1024  # iteration records kept per batcher (the daemon reports per request)
DEFAULT_TPOT_S = 1.0  # the TPOT target of a lease that gives none (seconds)
MIN_TPOT_S = 1e-3  # targets below this weigh as this
TPOT_PACE = 0.5  # a batcher is due this share of its tightest TPOT target after its last iteration began
LOAD_WAIT_S = 0.02  # how long a round with nothing to run waits for a replica being built

ModelKey = tuple[str, int, str | None, tuple[Stage, ...]]
BatcherKey = tuple[str, ModelKey]  # (replica id, its model)
ModelLoader = Callable[[str, int, Sequence[Stage], str | None], StagedModel]  # family, seed, stages, path


@dataclass(frozen=True)
class Lease:
    """A :class:`~service.domain.wire.LeaseGrant` as this executor runs it: its stages as the
    runner's, and the time it was received."""

    lease_id: str
    request_id: str
    replica_id: str
    family: str
    seed: int
    stages: tuple[Stage, ...]
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    received_s: float  # on the worker's clock: the origin of queued_s, ttft_s and e2e_s
    path: str | None = None  # the model directory to load (None: build the family from the seed)
    sampling: Sampling = GREEDY
    stop_ids: frozenset[int] = frozenset()
    stream: bool = False  # report its tokens as they come
    guest: bool = False  # its replica is a guest here: weighed by the worker's guest_weight
    tpot_s: float = 0.0  # its request's time-per-output-token target (0: none given, as DEFAULT_TPOT_S)
    yields: bool = False  # a sliced guest under owner priority: it runs in the owners' gaps (Worker.step_round)

    @staticmethod
    def from_json(raw: Mapping[str, Any], received_s: float) -> Lease:
        """Parse a lease (:meth:`LeaseGrant.from_json <service.domain.wire.LeaseGrant.from_json>`);
        ``KeyError``, ``TypeError``, ``ValueError`` or ``InvalidInputError`` if it is malformed."""
        g = LeaseGrant.from_json(raw)
        return Lease(g.lease_id, g.request_id, g.replica_id, g.family, g.seed,
                     tuple(Stage(s.device_id, s.start, s.end, s.url, g.yields) for s in g.stages), g.prompt_tokens,
                     g.max_tokens, received_s, g.model_path, g.sampling, frozenset(g.stop_ids), g.stream, g.guest,
                     g.tpot_s, g.yields)

    @property
    def model_key(self) -> ModelKey:
        """Leases with equal keys run the very same weights placed the same way."""
        return (self.family, self.seed, self.path, self.stages)


@dataclass
class RoundResult:
    completed: list[tuple[Lease, Completion]] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    slices: list[SliceResult] = field(default_factory=list)  # guest slices finished in this round's gaps


def completion_of(lease: Lease, request: GenerationRequest) -> Completion:
    """The completion of ``lease`` whose request the batcher has finished."""
    if request.admitted_s is None or request.first_token_s is None or request.finished_s is None:
        raise ValueError(f"lease {lease.lease_id}: its request has not finished")
    origin = lease.received_s
    return Completion(
        lease_id=lease.lease_id,
        output_tokens=list(request.tokens),
        queued_s=request.admitted_s - origin,
        ttft_s=request.first_token_s - origin,
        e2e_s=request.finished_s - origin,
        iterations=request.iterations,
        busy_s=request.busy_s,
        peak_bytes=request.peak_bytes,
        prefill_stage_s=tuple(None if math.isnan(t) else t for t in request.prefill_stage_s),
        decode_stage_s=tuple(None if math.isnan(t) else t for t in request.decode_stage_s),
        decode_batch=request.decode_batch,
        decode_context=request.decode_context,
    )


# ---- the torch side -----------------------------------------------------------------------------
class Worker:
    """Runs leases in continuous batchers, one per replica; no network, driven from one thread
    (replicas are built on a builder thread of its own, see :meth:`accept`).

    ``accept`` submits a lease's request (``ValueError`` or a domain error if it cannot run
    here), ``cancel`` drops it, ``step_round`` steps every non-idle batcher once and returns
    what finished, ``progress`` the streaming leases' tokens since its last call. Requests are
    keyed by lease id in the batchers.
    """

    def __init__(self, *, max_batch: int = 8, max_held: int | None = None, clock: Clock = time.perf_counter,
                 loader: ModelLoader = load_staged, guest_weight: float = GUEST_WEIGHT,
                 background_loads: bool = True, slice_budget_s: float = DEFAULT_SLICE_BUDGET_S,
                 guest_capacity_bytes: Mapping[str, int] | None = None, streams: StreamSelector | None = None,
                 slice_builder: Builder = build_slice_layers) -> None:
        if not guest_weight > 0:
            raise ValueError(f"guest_weight must be > 0, got {guest_weight}")
        self.max_batch = max_batch  # KV slots of one replica's batcher
        self.max_held = max_held or max_batch  # leases held at once, all replicas
        self.clock = clock
        self.guest_weight = guest_weight
        self._loader = loader
        self._models: dict[ModelKey, StagedModel] = {}  # the builder's (the loading thread's, if any)
        # Replicas being built (model and KV pool) off the main thread, and the leases waiting for them.
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="replica-build") if background_loads else None
        self._building: dict[BatcherKey, Future[ContinuousBatcher]] = {}
        self._parked: dict[str, Lease] = {}
        self._batchers: dict[tuple[str, ModelKey], ContinuousBatcher] = {}
        self._vtime: dict[tuple[str, ModelKey], float] = {}  # busy seconds / weight (module docstring)
        self._busy_keys: set[tuple[str, ModelKey]] = set()  # non-idle after the last round
        self._started: dict[tuple[str, ModelKey], float] = {}  # when its last iteration began (clock)
        self._held: dict[str, tuple[Lease, ContinuousBatcher]] = {}
        self._streaming: dict[str, tuple[GenerationRequest, int]] = {}  # lease id -> (request, tokens reported)
        self.busy_s = 0.0  # wall seconds spent in iterations, all replicas (the service's utilisation)
        # Held through each iteration of a replica that does not yield: a sliced guest's layers
        # that another node's worker sends to this node's stage server wait on it (StageServer.gate).
        self.compute_lock = threading.Lock()
        # Guest slices (executor.slices): their weights, and one run queue per compute unit.
        self.slice_budget_s = slice_budget_s
        self.streams = streams or StreamSelector()
        self.guest_layers = GuestLayers(capacity_bytes=guest_capacity_bytes, builder=slice_builder)
        self._units: dict[str, ComputeUnitQueue] = {}
        self._slice_ids: set[str] = set()

    @property
    def free_slots(self) -> int:
        return max(0, self.max_held - len(self._held) - len(self._parked))

    @property
    def busy(self) -> bool:
        return bool(self._held or self._parked or self._slice_ids)

    @property
    def lease_ids(self) -> list[str]:
        return [*self._held, *self._parked]

    @property
    def ready(self) -> list[str]:
        """The replicas built (their batchers installed): what a poll tells the service, which
        leases a replica one request at a time until it is among them."""
        return sorted({replica_id for replica_id, _ in self._batchers})

    def accept(self, lease: Lease) -> bool:
        """Submit ``lease``'s request into its replica's batcher; ``False`` if already held.

        A replica this worker has no batcher for yet is built (its model loaded or reused, its
        KV pool allocated) off the main thread, so the other replicas keep running meanwhile
        (measured live: building a guest's batcher beside two busy executors took 0.96 s, which
        the owners' requests waited out); its leases wait for it and join it at the first round
        after it is built. What the build would refuse (an unknown model, stages that do not
        cover its layers, an unknown device, too long a request) is refused here."""
        if lease.lease_id in self._held or lease.lease_id in self._parked:
            return False
        key = (lease.replica_id, lease.model_key)
        batcher = self._batchers.get(key)
        if batcher is not None:
            self._submit(lease, batcher)
        elif self._builder is None:
            self._submit(lease, self._install(key, self._build(lease)))
        else:
            _check_buildable(lease)
            if key not in self._building:
                self._building[key] = self._builder.submit(self._build, lease)
            self._parked[lease.lease_id] = lease
        return True

    def _submit(self, lease: Lease, batcher: ContinuousBatcher) -> None:
        request = GenerationRequest(lease.lease_id, list(lease.prompt_tokens), lease.max_tokens,
                                    arrival_s=lease.received_s, sampling=lease.sampling, stop_ids=lease.stop_ids)
        batcher.submit(request)
        self._held[lease.lease_id] = (lease, batcher)
        if lease.stream:
            self._streaming[lease.lease_id] = (request, 0)

    def _admit_built(self, result: RoundResult) -> None:
        """Install the replicas built since the last round and submit the leases that waited for
        them (a lease whose replica could not be built, or that its batcher refuses, fails)."""
        if not self._building:
            return
        if not any(not b.idle for b in self._batchers.values()):  # nothing else to run: wait a little
            wait(list(self._building.values()), timeout=LOAD_WAIT_S, return_when=FIRST_COMPLETED)
        for key, future in list(self._building.items()):
            if not future.done():
                continue
            del self._building[key]
            waiting = [lease for lease in self._parked.values() if (lease.replica_id, lease.model_key) == key]
            for lease in waiting:
                del self._parked[lease.lease_id]
            try:
                batcher = self._install(key, future.result())
            except Exception as exc:
                log.error("replica %s could not be built: %s", key[0], exc)
                result.failed.extend(Failure(lease.lease_id, f"executor error: {exc}") for lease in waiting)
                continue
            for lease in waiting:
                try:
                    self._submit(lease, batcher)
                except Exception as exc:
                    result.failed.append(Failure(lease.lease_id, str(exc)))

    def cancel(self, lease_id: str) -> bool:
        """Drop a held lease from its batcher; ``False`` if it is not held (e.g. finished)."""
        if self._parked.pop(lease_id, None) is not None:
            return True
        held = self._held.pop(lease_id, None)
        if held is None:
            return False
        self._streaming.pop(lease_id, None)
        held[1].remove(lease_id)
        return True

    def accept_slice(self, assignment: SliceAssignment) -> bool:
        """Queue a guest slice on its compute unit's run queue, its layers materialised now (once
        per model, layers and device); ``False`` if already held. An assignment that cannot run
        here raises :class:`~executor.slices.SliceRefused` with nothing allocated."""
        if assignment.lease_id in self._slice_ids:
            return False
        layers = self.guest_layers.materialise(assignment)
        unit = self._units.get(assignment.device_id)
        if unit is None:
            unit = self._units[assignment.device_id] = ComputeUnitQueue(
                assignment.device_id, slice_budget_s=self.slice_budget_s, clock=self.clock, streams=self.streams)
        unit.add(layers, assignment)
        self._slice_ids.add(assignment.lease_id)
        return True

    def release_guests(self, device_id: str, reason: str | None = None) -> list[Failure]:
        """The scheduler no longer uses ``device_id`` for guests: its queued slices are dropped
        (failed with ``reason``, so that the service runs them elsewhere) and every guest's
        weights there are released."""
        failures = []
        unit = self._units.pop(device_id, None)
        if unit is not None:
            for lease_id in unit.lease_ids():
                self._slice_ids.discard(lease_id)
                failures.append(Failure(lease_id, reason or f"guest slices released from {device_id}"))
        self.guest_layers.release(device_id)
        return failures

    def _owner_waiting(self, device_id: str) -> bool:
        """Whether an owner's iteration on ``device_id`` is ready now: a non-guest batcher there
        with a request waiting for its prefill, its batch pressed, or its pace due (the module
        docstring); a guest slice yields to it."""
        now = self.clock()
        _, tpot = self._targets()
        guests = {(lease.replica_id, lease.model_key) for lease, _ in self._held.values() if lease.guest}
        for key, b in self._batchers.items():
            if b.idle or key in guests or all(s.device_id != device_id for s in key[1][3]):
                continue
            if b.pressed or now - self._started.get(key, -math.inf) >= TPOT_PACE * tpot.get(key, DEFAULT_TPOT_S):
                return True
        return False

    def _run_gaps(self, result: RoundResult) -> None:
        """Each compute unit's guest slices in its owner's gap (owners ran first this round)."""
        for device_id, unit in list(self._units.items()):
            if not len(unit):
                continue
            try:
                done = unit.run_gap(functools.partial(self._owner_waiting, device_id))
            except Exception as exc:
                log.exception("guest slices on %s failed; failing them", device_id)
                result.failed.extend(self.release_guests(device_id, f"executor error: {exc}"))
                continue
            for r in done:
                self._slice_ids.discard(r.assignment.lease_id)
            result.slices.extend(done)

    def progress(self) -> list[ProgressUpdate]:
        """The tokens each held streaming lease produced since the last call (a finished lease's
        last tokens travel with its completion instead)."""
        updates = []
        for lease_id, (request, reported) in self._streaming.items():
            if len(request.tokens) > reported:
                updates.append(ProgressUpdate(lease_id, reported, tuple(request.tokens[reported:])))
                self._streaming[lease_id] = (request, len(request.tokens))
        return updates

    def step_round(self) -> RoundResult:
        """As many iterations as there are non-idle batchers, each of the due (else non-idle)
        batcher with the least virtual time (the module docstring: fair by time, weighted by role
        and TPOT, paced by TPOT). A batcher whose step raises (e.g. out of memory) is dropped and
        its leases fail: its state is no longer trusted."""
        result = RoundResult()
        self._admit_built(result)
        weight, tpot = self._targets()
        yielding = {(lease.replica_id, lease.model_key) for lease, _ in self._held.values() if lease.yields}
        busy = [k for k, b in self._batchers.items() if not b.idle]
        waking = [k for k in busy if k not in self._busy_keys]
        if waking:  # they start level with the least busy virtual time (all level when none was busy)
            floor = min((self._vtime[k] for k in busy if k in self._busy_keys),
                        default=max(self._vtime[k] for k in waking))
            for k in waking:
                self._vtime[k] = max(self._vtime[k], floor)
        for _ in range(len(busy)):
            ready = [k for k, b in self._batchers.items() if not b.idle]
            if not ready:
                break
            if len(ready) > 1:
                now = self.clock()

                def due(k: BatcherKey, now: float = now) -> bool:
                    b = self._batchers[k]
                    return b.pressed or now - self._started.get(k, -math.inf) >= TPOT_PACE * tpot.get(k, DEFAULT_TPOT_S)
                if yielding and any(k not in yielding and (self._batchers[k].admitting or due(k)) for k in ready):
                    ready = [k for k in ready if k not in yielding]  # an owner is due: sliced guests wait for a gap
                ready = [k for k in ready if self._batchers[k].admitting] or [k for k in ready if due(k)] or ready
            key = min(ready, key=lambda k: (self._vtime[k], k[0]))
            self._step(key, weight.get(key, 1.0), result, gated=key not in yielding)
        self._busy_keys = {k for k, b in self._batchers.items() if not b.idle}
        self._run_gaps(result)
        return result

    def _targets(self) -> tuple[dict[tuple[str, ModelKey], float], dict[tuple[str, ModelKey], float]]:
        """Each batcher's weight (the module docstring: its role's over its leases' tightest TPOT
        target) and that target."""
        weight: dict[tuple[str, ModelKey], float] = {}
        tpot: dict[tuple[str, ModelKey], float] = {}
        for lease, _ in self._held.values():
            key = (lease.replica_id, lease.model_key)
            target = max(MIN_TPOT_S, lease.tpot_s or DEFAULT_TPOT_S)
            weight[key] = max(weight.get(key, 0.0), (self.guest_weight if lease.guest else 1.0) / target)
            tpot[key] = min(tpot.get(key, math.inf), target)
        return weight, tpot

    def _step(self, key: tuple[str, ModelKey], weight: float, result: RoundResult, *, gated: bool = True) -> None:
        """One iteration of the batcher ``key``; ``gated`` (it does not yield): under
        :attr:`compute_lock`, so that sliced guests' stages sent here wait for it."""
        batcher = self._batchers[key]
        role: Literal["owner", "guest"] = "guest" if weight_is_guest(self._held.values(), key) else "owner"
        try:
            with self.compute_lock if gated else contextlib.nullcontext(), self.streams.running(batcher.device, role):
                record = batcher.step()
        except Exception as exc:
            log.exception("replica %s failed an iteration; failing its leases", key[0])
            self._forget(key)
            result.failed.extend(self._drop_leases_of(batcher, f"executor error: {exc}"))
            return
        if record is not None:
            self.busy_s += record.duration_s
            self._vtime[key] += record.duration_s / weight
            self._started[key] = record.start_s
        for request in batcher.take_finished():
            lease, _ = self._held.pop(request.request_id)
            self._streaming.pop(request.request_id, None)
            result.completed.append((lease, completion_of(lease, request)))

    def _forget(self, key: tuple[str, ModelKey]) -> None:
        del self._batchers[key], self._vtime[key]
        self._started.pop(key, None)
        self._busy_keys.discard(key)

    def _drop_leases_of(self, batcher: ContinuousBatcher, reason: str) -> list[Failure]:
        lease_ids = [lid for lid, (_, b) in self._held.items() if b is batcher]
        for lid in lease_ids:
            del self._held[lid]
            self._streaming.pop(lid, None)
        return [Failure(lid, reason) for lid in lease_ids]

    def _build(self, lease: Lease) -> ContinuousBatcher:
        """A batcher for the lease's replica, its model loaded once per :data:`ModelKey` (on the
        builder thread when there is one)."""
        model = self._models.get(lease.model_key)
        if model is None:
            model = self._loader(lease.family, lease.seed, lease.stages, lease.path)
            self._models[lease.model_key] = model
            log.info("loaded %s (seed %d) on %s", lease.path or lease.family, lease.seed,
                     ", ".join(f"{s.device_id}[{s.start}:{s.end})" for s in lease.stages))
        return ContinuousBatcher(model, max_batch=self.max_batch, clock=self.clock, history=ITERATION_HISTORY)

    def _install(self, key: BatcherKey, batcher: ContinuousBatcher) -> ContinuousBatcher:
        self._batchers[key] = batcher
        self._vtime[key] = 0.0
        return batcher


def weight_is_guest(held: Iterable[tuple[Lease, ContinuousBatcher]], key: BatcherKey) -> bool:
    """Whether the batcher ``key`` runs a guest replica (its leases say so)."""
    return any(lease.guest for lease, _ in held if (lease.replica_id, lease.model_key) == key)


def _check_buildable(lease: Lease) -> None:
    """Raise what building the lease's replica (and submitting it) would: an unknown model,
    stages that do not cover its layers, an unknown first device, a request too long for it."""
    if lease.path is not None:
        from service.models.hf import hf_config

        config = hf_config(lease.path)
    else:
        from service.domain.model_config import model_config

        config = model_config(lease.family)
    check_stages(lease.stages, config.n_layers)
    torch_device(lease.stages[0].device_id)
    total = len(lease.prompt_tokens) + lease.max_tokens
    if total > config.max_seq_len:
        raise ValueError(f"{lease.request_id}: prompt + max_new_tokens = {total} exceeds {config.max_seq_len}")
