"""The discrete-event engine: a priority queue of past-tense facts and the loop that owns it.

Pure: no wall clock, no I/O, no randomness. Events are ordered by the key
``(time_s, priority, seq)``: ``priority`` comes from the event's type (:data:`SAME_TIME_ORDER`,
stated once, here) and ``seq`` is a per-engine counter, so two events with the same time and
type run in the order they were scheduled. ``now_s`` changes only inside :meth:`Engine.step`.

Handlers are registered per event type; a handler returns the events that follow from the one
it handled and never touches the queue itself. Observers see every handled event after its
handler ran (metrics live there, not in the handlers).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from service.domain.request import RequestSpec
from service.domain.workflow import Workflow


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """A fact that becomes true at ``time_s`` (simulated seconds from t=0)."""

    time_s: float
    priority: ClassVar[int] = 99


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferFinished(Event):
    """The bytes of ``transfer_id`` have arrived at the destination device."""

    transfer_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationFinished(Event):
    """Iteration number ``iteration`` of replica ``replica_id`` has completed on all its devices."""

    replica_id: str
    iteration: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceFinished(Event):
    """A placed slice (scheduler-made, outside any replica's batching) finished on its device."""

    slice_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StageReady(Event):
    """Slice ``stage`` of a sliced replica's iteration has its inputs on its device."""

    replica_id: str
    iteration: int
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StageFinished(Event):
    """Slice ``stage`` of a sliced replica's iteration has run."""

    replica_id: str
    iteration: int
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestArrived(Event):
    """``request`` reached the cluster and wants a replica of its model. ``released``: it arrived
    earlier (its ``arrival_s``) and is handed over now, already counted by :meth:`note_arrivals`
    (a live mirror's backlog)."""

    request: RequestSpec
    released: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRequested(Event):
    """Replica ``replica_id`` was asked to consider starting an iteration (it was idle)."""

    replica_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFinished(Event):
    """Tool call ``step_id`` of workflow ``workflow_id`` has finished on its CPU slot."""

    workflow_id: str
    step_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowArrived(Event):
    """``workflow`` reached the cluster: its root steps are released (service.sim.workflow)."""

    workflow: Workflow


# Same-time ordering, stated once: a finished transfer delivers data before anything that
# needs it starts; finished work frees devices and memory before new work is admitted; all
# arrivals of an instant are queued before an idle replica forms its batch, so simultaneous
# arrivals share one iteration instead of the first one running alone. A finished tool call
# releases its workflow's next steps (requests) and a workflow's arrival its roots before any
# replica forms a batch at that instant.
SAME_TIME_ORDER: tuple[type[Event], ...] = (
    TransferFinished, IterationFinished, SliceFinished, StageFinished, ToolFinished, WorkflowArrived, RequestArrived,
    StepRequested, StageReady,
)
for _rank, _kind in enumerate(SAME_TIME_ORDER):
    _kind.priority = _rank

Handler = Callable[[Any], Iterable[Event]]
Observer = Callable[[Event], None]


class Engine:
    """Event loop. ``log`` (when enabled) records every handled event in handling order.

    Invariants: events are handled in non-decreasing ``time_s``; a handler may not return an
    event earlier than the current time (raises ``ValueError``: a causality bug is loud).
    """

    def __init__(self, *, record_log: bool = False) -> None:
        self._queue: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        self._now_s = 0.0
        self._handlers: dict[type[Event], Handler] = {}
        self._observers: list[Observer] = []
        self.log: list[Event] | None = [] if record_log else None
        self.num_handled = 0

    @property
    def now_s(self) -> float:
        return self._now_s

    @property
    def num_scheduled(self) -> int:
        """Events ever scheduled on this engine (a fork starts from its original's count)."""
        return self._seq

    def on(self, kind: type[Event], handler: Handler) -> None:
        """Register the handler of one event type (one per type; re-registering replaces it)."""
        self._handlers[kind] = handler

    def observe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def schedule(self, event: Event) -> None:
        if event.time_s < self._now_s:
            raise ValueError(f"event {event!r} is in the past (now {self._now_s})")
        heapq.heappush(self._queue, (event.time_s, event.priority, self._seq, event))
        self._seq += 1

    def peek(self) -> float | None:
        """Time of the next event, or ``None`` when the queue is empty."""
        return self._queue[0][0] if self._queue else None

    def step(self) -> Event:
        """Handle the next event; raise ``IndexError`` on an empty queue."""
        time_s, _, _, event = heapq.heappop(self._queue)
        self._now_s = time_s
        handler = self._handlers.get(type(event))
        if handler is None:
            raise LookupError(f"no handler for {type(event).__name__}")
        follow = handler(event)
        if follow:
            for nxt in follow:
                self.schedule(nxt)
        if self.log is not None:
            self.log.append(event)
        for obs in self._observers:
            obs(event)
        self.num_handled += 1
        return event

    def run(self, until: float | None = None) -> None:
        """Handle events while any is due at or before ``until`` (all of them when ``None``)."""
        queue = self._queue
        while queue and (until is None or queue[0][0] <= until):
            self.step()

    def advance_to(self, time_s: float) -> None:
        """Move the clock to ``time_s`` with nothing due before it (a mirror catching up with the
        live clock it mirrors); raises ``ValueError`` when that would skip an event or go back."""
        if time_s < self._now_s or (self._queue and self._queue[0][0] < time_s):
            raise ValueError(f"cannot advance to {time_s}: now {self._now_s}, next event {self.peek()}")
        self._now_s = time_s

    # ---- forking (what-if) ---------------------------------------------------------------
    def pending(self) -> list[tuple[float, int, int, Event]]:
        """The queued entries ``(time_s, priority, seq, event)``, in no particular order."""
        return list(self._queue)

    def fork(self, keep: Callable[[Event], bool]) -> Engine:
        """A new engine at the same time holding the queued events ``keep`` accepts, with their
        original keys (so their relative order is unchanged) and the same counter, no handlers."""
        other = Engine(record_log=self.log is not None)
        other._now_s = self._now_s
        other._seq = self._seq
        other._queue = [entry for entry in self._queue if keep(entry[3])]
        heapq.heapify(other._queue)
        return other
