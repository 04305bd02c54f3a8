"""The executor's torch side: leases in, completions out, no network.

:class:`Worker` runs each lease's request in the continuous batcher of its replica: one
:class:`~executor.batcher.ContinuousBatcher` per replica; a model is built (or, from a model
directory, loaded) once per ``(family, seed, path, stages)`` and stays resident. A round steps
every non-idle batcher once; the new tokens of streaming leases are collected after it
(:meth:`Worker.progress`). It is driven from one thread (the daemon's main thread,
:mod:`executor.daemon`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.batcher import Clock, ContinuousBatcher, GenerationRequest
from executor.runner import Stage, StagedModel, load_staged
from service.domain.sampling import GREEDY, Sampling
from service.domain.wire import Completion, Failure, LeaseGrant, ProgressUpdate

log = logging.getLogger("slicesched.executor")

ITERATION_HISTORY = 1024  # iteration records kept per batcher (the daemon reports per request)

ModelKey = tuple[str, int, str | None, tuple[Stage, ...]]
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

    @staticmethod
    def from_json(raw: Mapping[str, Any], received_s: float) -> Lease:
        """Parse a lease (:meth:`LeaseGrant.from_json <service.domain.wire.LeaseGrant.from_json>`);
        ``KeyError``, ``TypeError``, ``ValueError`` or ``InvalidInputError`` if it is malformed."""
        g = LeaseGrant.from_json(raw)
        return Lease(g.lease_id, g.request_id, g.replica_id, g.family, g.seed,
                     tuple(Stage(s.device_id, s.start, s.end, s.url) for s in g.stages), g.prompt_tokens,
                     g.max_tokens, received_s, g.model_path, g.sampling, frozenset(g.stop_ids), g.stream)

    @property
    def model_key(self) -> ModelKey:
        """Leases with equal keys run the very same weights placed the same way."""
        return (self.family, self.seed, self.path, self.stages)


@dataclass
class RoundResult:
    completed: list[tuple[Lease, Completion]] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)


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
    )


# ---- the torch side -----------------------------------------------------------------------------
class Worker:
    """Runs leases in continuous batchers, one per replica; no network, main thread only.

    ``accept`` submits a lease's request (``ValueError`` or a domain error if it cannot run
    here), ``cancel`` drops it, ``step_round`` steps every non-idle batcher once and returns
    what finished, ``progress`` the streaming leases' tokens since its last call. Requests are
    keyed by lease id in the batchers.
    """

    def __init__(self, *, max_batch: int = 8, max_held: int | None = None, clock: Clock = time.perf_counter,
                 loader: ModelLoader = load_staged) -> None:
        self.max_batch = max_batch  # KV slots of one replica's batcher
        self.max_held = max_held or max_batch  # leases held at once, all replicas
        self.clock = clock
        self._loader = loader
        self._models: dict[ModelKey, StagedModel] = {}
        self._batchers: dict[tuple[str, ModelKey], ContinuousBatcher] = {}
        self._held: dict[str, tuple[Lease, ContinuousBatcher]] = {}
        self._streaming: dict[str, tuple[GenerationRequest, int]] = {}  # lease id -> (request, tokens reported)
        self.busy_s = 0.0  # wall seconds spent in iterations, all replicas (the service's utilisation)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_held - len(self._held))

    @property
    def busy(self) -> bool:
        return bool(self._held)

    @property
    def lease_ids(self) -> list[str]:
        return list(self._held)

    def accept(self, lease: Lease) -> bool:
        """Submit ``lease``'s request into its replica's batcher; ``False`` if already held."""
        if lease.lease_id in self._held:
            return False
        batcher = self._batcher_for(lease)
        request = GenerationRequest(lease.lease_id, list(lease.prompt_tokens), lease.max_tokens,
                                    arrival_s=lease.received_s, sampling=lease.sampling, stop_ids=lease.stop_ids)
        batcher.submit(request)
        self._held[lease.lease_id] = (lease, batcher)
        if lease.stream:
            self._streaming[lease.lease_id] = (request, 0)
        return True

    def cancel(self, lease_id: str) -> bool:
        """Drop a held lease from its batcher; ``False`` if it is not held (e.g. finished)."""
        held = self._held.pop(lease_id, None)
        if held is None:
            return False
        self._streaming.pop(lease_id, None)
        held[1].remove(lease_id)
        return True

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
        """One iteration of every non-idle batcher, round robin. A batcher whose step raises
        (e.g. out of memory) is dropped and its leases fail: its state is no longer trusted."""
        result = RoundResult()
        for key, batcher in list(self._batchers.items()):
            if batcher.idle:
                continue
            try:
                record = batcher.step()
            except Exception as exc:
                log.exception("replica %s failed an iteration; failing its leases", key[0])
                del self._batchers[key]
                result.failed.extend(self._drop_leases_of(batcher, f"executor error: {exc}"))
                continue
            if record is not None:
                self.busy_s += record.duration_s
            for request in batcher.take_finished():
                lease, _ = self._held.pop(request.request_id)
                self._streaming.pop(request.request_id, None)
                result.completed.append((lease, completion_of(lease, request)))
        return result

    def _drop_leases_of(self, batcher: ContinuousBatcher, reason: str) -> list[Failure]:
        lease_ids = [lid for lid, (_, b) in self._held.items() if b is batcher]
        for lid in lease_ids:
            del self._held[lid]
            self._streaming.pop(lid, None)
        return [Failure(lid, reason) for lid in lease_ids]

    def _batcher_for(self, lease: Lease) -> ContinuousBatcher:
        key = (lease.replica_id, lease.model_key)
        if key not in self._batchers:
            model = self._models.get(lease.model_key)
            if model is None:
                model = self._loader(lease.family, lease.seed, lease.stages, lease.path)
                self._models[lease.model_key] = model
                log.info("loaded %s (seed %d) on %s", lease.path or lease.family, lease.seed,
                         ", ".join(f"{s.device_id}[{s.start}:{s.end})" for s in lease.stages))
            self._batchers[key] = ContinuousBatcher(model, max_batch=self.max_batch, clock=self.clock,
                                                    history=ITERATION_HISTORY)
        return self._batchers[key]
