"""The event engine: ordering, the loop's ownership of the queue, the log."""

from __future__ import annotations

import pytest

from service.domain.request import RequestSpec
from service.domain.workflow import Workflow
from service.sim.engine import (
    SAME_TIME_ORDER,
    Engine,
    Event,
    IterationFinished,
    RequestArrived,
    SliceFinished,
    StageFinished,
    StageReady,
    StepRequested,
    ToolFinished,
    TransferFinished,
    WorkflowArrived,
)

REQ = RequestSpec("q0", "t0", "tiny", 0.0, 4, 2)
WF = Workflow.from_dict({"workflow_id": "w", "tenant_id": "t0", "slo_s": 1.0,
                         "steps": [{"step_id": "a", "kind": "tool", "role": "x", "tool": "x"}]})


def _one_of_each(t: float) -> list[Event]:
    return [StageReady(time_s=t, replica_id="g", iteration=0, stage=1), StepRequested(time_s=t, replica_id="r"),
            RequestArrived(time_s=t, request=REQ), WorkflowArrived(time_s=t, workflow=WF),
            ToolFinished(time_s=t, workflow_id="w", step_id="a"), StageFinished(time_s=t, replica_id="g", iteration=0, stage=0),
            SliceFinished(time_s=t, slice_id="s"), IterationFinished(time_s=t, replica_id="r", iteration=0),
            TransferFinished(time_s=t, transfer_id=0)]


def _recording_engine() -> tuple[Engine, list[Event]]:
    engine = Engine(record_log=True)
    seen: list[Event] = []
    for kind in SAME_TIME_ORDER:
        engine.on(kind, lambda ev: seen.append(ev) or [])
    return engine, seen


def test_same_time_events_run_in_the_stated_type_order() -> None:
    engine, seen = _recording_engine()
    for ev in _one_of_each(1.0):  # scheduled in reverse of the stated order
        engine.schedule(ev)
    engine.run()
    assert [type(e) for e in seen] == list(SAME_TIME_ORDER)
    assert [type(e).priority for e in seen] == sorted(type(e).priority for e in seen)


def test_same_time_same_type_events_run_in_scheduling_order() -> None:
    engine, seen = _recording_engine()
    for i in range(5):
        engine.schedule(StepRequested(time_s=2.0, replica_id=f"r{4 - i}"))
    engine.run()
    assert [e.replica_id for e in seen] == ["r4", "r3", "r2", "r1", "r0"]  # type: ignore[attr-defined]


def test_time_orders_before_priority() -> None:
    engine, seen = _recording_engine()
    engine.schedule(TransferFinished(time_s=2.0, transfer_id=1))
    engine.schedule(StepRequested(time_s=1.0, replica_id="r"))
    engine.run()
    assert [e.time_s for e in seen] == [1.0, 2.0]


def test_now_changes_only_in_step_and_peek_does_not_advance() -> None:
    engine, _ = _recording_engine()
    engine.schedule(StepRequested(time_s=3.0, replica_id="r"))
    assert engine.now_s == 0.0
    assert engine.peek() == 3.0
    assert engine.now_s == 0.0
    engine.step()
    assert engine.now_s == 3.0
    assert engine.peek() is None


def test_handlers_return_follow_on_events_which_the_loop_schedules() -> None:
    engine = Engine(record_log=True)

    def chain(ev: StepRequested) -> list[Event]:
        n = int(ev.replica_id)
        return [StepRequested(time_s=ev.time_s + 1.0, replica_id=str(n + 1))] if n < 3 else []

    engine.on(StepRequested, chain)
    engine.schedule(StepRequested(time_s=0.0, replica_id="0"))
    engine.run()
    assert engine.log is not None
    assert [(e.time_s, e.replica_id) for e in engine.log] == [  # type: ignore[attr-defined]
        (0.0, "0"), (1.0, "1"), (2.0, "2"), (3.0, "3")]


def test_run_until_stops_at_the_bound_inclusive() -> None:
    engine, seen = _recording_engine()
    for t in (1.0, 2.0, 3.0):
        engine.schedule(StepRequested(time_s=t, replica_id="r"))
    engine.run(until=2.0)
    assert [e.time_s for e in seen] == [1.0, 2.0]
    assert engine.now_s == 2.0
    assert engine.peek() == 3.0


def test_an_event_in_the_past_is_refused_loudly() -> None:
    engine = Engine()
    engine.on(StepRequested, lambda ev: [StepRequested(time_s=ev.time_s - 1.0, replica_id="r")])
    engine.schedule(StepRequested(time_s=5.0, replica_id="r"))
    with pytest.raises(ValueError, match="in the past"):
        engine.step()


def test_an_event_without_handler_fails() -> None:
    engine = Engine()
    engine.schedule(StepRequested(time_s=0.0, replica_id="r"))
    with pytest.raises(LookupError):
        engine.step()


def test_observers_see_every_handled_event_after_its_handler() -> None:
    engine, seen = _recording_engine()
    observed: list[tuple[Event, int]] = []
    engine.observe(lambda ev: observed.append((ev, len(seen))))
    for ev in _one_of_each(0.5):
        engine.schedule(ev)
    engine.run()
    assert [e for e, _ in observed] == seen
    assert [n for _, n in observed] == list(range(1, len(SAME_TIME_ORDER) + 1))


def test_fork_keeps_selected_events_with_their_order() -> None:
    engine, _ = _recording_engine()
    for ev in _one_of_each(1.0):
        engine.schedule(ev)
    fork = engine.fork(lambda ev: not isinstance(ev, RequestArrived))
    seen: list[Event] = []
    for kind in SAME_TIME_ORDER:
        fork.on(kind, lambda ev: seen.append(ev) or [])
    fork.run()
    assert [type(e) for e in seen] == [k for k in SAME_TIME_ORDER if k is not RequestArrived]
    assert engine.peek() == 1.0 and len(engine.pending()) == len(SAME_TIME_ORDER)  # the original is untouched
